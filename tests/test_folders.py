"""Output folders: the --out a user spells is the folder the system resolves, and what is there is never lost.

Each case here once deleted or stranded something (a reviewer's `--out nosuch/..` emptied the folder it was run
in, `link/.. --overwrite` replaced the wrong folder, `report --out .` crashed after loading the models).
"""

import os
from pathlib import Path

import pytest

from headscan.errors import TablesError
from headscan.report.build import check_report_options
from headscan.tables import check_out, folders


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _fill(*names):
    def fill(folder: Path) -> None:
        for name in names:
            (folder / name).write_text(name)
    return fill


def test_dot_dot_after_a_missing_folder_is_the_folder_one_is_in_and_it_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("notes.txt").write_text("mine")
    with pytest.raises(TablesError, match=r"^nosuch/\.\.: already holds files; pass --overwrite"):
        check_out("nosuch/..")
    with pytest.raises(TablesError, match=r"^nosuch/\.\.: holds files but no run.json"):
        check_out("nosuch/..", overwrite=True)
    assert _files(tmp_path) == ["notes.txt"]


def test_a_link_then_dot_dot_names_the_folder_the_link_points_into(tmp_path, monkeypatch):
    run = tmp_path / "run"
    (run / "sub").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    here = tmp_path / "work"
    here.mkdir()
    (here / "mine.txt").write_text("mine")
    (here / "link").symlink_to(run / "sub")
    monkeypatch.chdir(here)
    assert check_out("link/..", overwrite=True) == run.resolve()  # as mkdir and open read it: not `here`
    assert folders.publish("link/..", _fill("run.json", "heads.parquet"), last="run.json") == run.resolve()
    assert _files(run) == ["heads.parquet", "run.json"] and _files(here) == ["link", "mine.txt"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging or old folder left


def test_the_folder_one_is_in_or_holding_it_is_never_replaced(tmp_path, monkeypatch):
    (tmp_path / "run" / "deeper").mkdir(parents=True)
    (tmp_path / "run" / "run.json").write_text("{}")
    monkeypatch.chdir(tmp_path / "run" / "deeper")
    with pytest.raises(TablesError, match=rf"^\.\.: is the folder you are in, .*; cd to {tmp_path} and pass --out run$"):
        check_out("..", overwrite=True)
    (tmp_path / "run" / "deeper").rmdir()
    (tmp_path / "run" / "index.html").write_text("<html>")
    (tmp_path / "run" / "run.json").unlink()
    monkeypatch.chdir(tmp_path / "run")
    with pytest.raises(TablesError, match=r"^\.: is the folder you are in"):
        check_report_options(top=10, out=".")


def test_an_empty_folder_is_filled_in_place_last_file_last_and_kept(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    inode = out.stat().st_ino
    order = []
    real_replace = os.replace

    def recording(src, dst):
        order.append(Path(dst).name)
        real_replace(src, dst)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(folders.os, "replace", recording)
        folders.publish(out, _fill("b", "run.json", "a"), last="run.json")
    assert order[-1] == "run.json" and sorted(order) == ["a", "b", "run.json"]
    assert out.stat().st_ino == inode and _files(out) == ["a", "b", "run.json"]  # the same folder, filled


def test_a_fill_that_fails_midway_leaves_the_folder_empty_as_it_was(tmp_path, monkeypatch):
    out = tmp_path / "empty"
    out.mkdir()
    calls = []
    real_replace = os.replace

    def failing(src, dst):
        calls.append(dst)
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C between two moves
        real_replace(src, dst)

    monkeypatch.setattr(folders.os, "replace", failing)
    with pytest.raises(KeyboardInterrupt):
        folders.publish(out, _fill("a", "b", "c", "run.json"), last="run.json")
    assert _files(out) == []  # the two moved files went back, and the hidden build folder is gone
    monkeypatch.undo()
    check_out(out)  # so the same command can run again


def test_a_failed_replacement_keeps_the_old_folder(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text("old")

    def broken(folder: Path) -> None:
        (folder / "run.json").write_text("new")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        folders.publish(out, broken)
    assert (out / "run.json").read_text() == "old" and _files(tmp_path) == ["run"]
