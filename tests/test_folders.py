"""Output folders: the --out a user spells is the folder the system resolves, and what is there is never lost.

Each case here once deleted or stranded something (a reviewer's `--out nosuch/..` emptied the folder it was run
in, `link/.. --overwrite` replaced the wrong folder, `report --out .` crashed after loading the models).
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from headscan.errors import TablesError
from headscan.report import check_report_options
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
    for overwrite in (False, True):  # the first refusal already says what --overwrite would not mend
        with pytest.raises(TablesError, match=r"^nosuch/\.\.: holds files but no run.json, .*; choose another --out, "
                                              r"or empty the folder$"):
            check_out("nosuch/..", overwrite=overwrite)
    assert _files(tmp_path) == ["notes.txt"]


def test_a_link_then_dot_dot_names_the_folder_the_link_points_into(tmp_path, monkeypatch):
    run = tmp_path / "run"
    (run / "state").mkdir(parents=True)  # a folder a sharded run writes
    (run / "run.json").write_text("{}")
    here = tmp_path / "work"
    here.mkdir()
    (here / "mine.txt").write_text("mine")
    (here / "link").symlink_to(run / "state")
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


# --- refused before any work, and a replaced folder keeps its mode ------------------------------------------


def test_a_symlink_loop_is_refused_before_any_work(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(TablesError, match=r"^.*a: is a symbolic link that leads nowhere \(a loop, or a target that "
                                          r"is gone\); remove it or choose another --out$"):
        check_out(tmp_path / "a")


def test_a_symlink_loop_above_the_folder_is_refused_before_any_work(tmp_path):
    # `where` cannot resolve a loop, so it stays in the path; the folder under it was made only after the sweep
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    said = (rf"^.*a/run: {tmp_path / 'a'} is a symbolic link that leads nowhere \(a loop, or a target that is gone\); "
            r"remove it or choose another --out$")
    with pytest.raises(TablesError, match=said):
        check_out(tmp_path / "a" / "run")
    with pytest.raises(TablesError, match=said.replace("/run:", "/report:")):
        check_report_options(top=1, out=tmp_path / "a" / "report")
    with pytest.raises(TablesError, match=said.replace("/run:", "/x/y:")):
        check_out(tmp_path / "a" / "x" / "y")


def test_a_name_too_long_for_the_file_system_is_refused_before_any_work(tmp_path):
    longest = os.pathconf(tmp_path, "PC_NAME_MAX")
    fits = "r" * (longest - folders.NAME_OVERHEAD)
    check_out(tmp_path / fits)  # room left for ".NAME.XXXXXXXX.new" beside it
    folders.publish(tmp_path / fits, _fill("run.json"))
    with pytest.raises(TablesError, match=rf"^.*: the name r{{40}}\.\.\. is too long for this file system \(at most "
                                          rf"{longest - folders.NAME_OVERHEAD} bytes"):
        check_out(tmp_path / (fits + "r"))


def test_a_name_that_is_not_utf8_is_refused_before_any_work(tmp_path, tiny_gpt2):
    """A byte of another encoding in --out (os.fsdecode gives a lone surrogate for it) reached pyarrow only after
    the sweep, which raised UnicodeEncodeError; it is refused first, in one line, from the CLI too."""
    from click.testing import CliRunner

    from headscan.cli import cli

    bad = os.fsdecode(bytes(tmp_path) + b"/caf\xe9")
    with pytest.raises(TablesError, match=r"caf\\udce9: is not valid UTF-8 .* choose another --out$"):
        check_out(bad)
    result = CliRunner().invoke(cli, ["sweep", "-m", str(tiny_gpt2), "--limit", "2", "--bootstrap", "0", "-q",
                                      "--out", bad])
    assert result.exit_code == 1 and "is not valid UTF-8" in result.output and "Traceback" not in result.output
    assert not result.exception or isinstance(result.exception, SystemExit)
    assert os.listdir(tmp_path) == []


def test_a_mount_point_that_holds_files_is_refused_before_any_work(tmp_path, monkeypatch):
    run = tmp_path / "mnt"
    run.mkdir()
    (run / "run.json").write_text("{}")
    real = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda path: Path(path) == run or real(path))  # no mount(8) in a test
    with pytest.raises(TablesError, match=r"mnt: is a mount point that holds files, and a mount point cannot be "
                                          r"swapped for a new folder; pass a folder inside it, or empty it$"):
        check_out(run, overwrite=True)
    (run / "run.json").unlink()
    check_out(run)  # empty: filled in place, which a mount point allows


@contextlib.contextmanager
def mount_point(folder: Path):
    """`folder` as the mount point of a new, empty tmpfs for the block; skips the test where mounting needs rights
    this process lacks."""
    folder.mkdir()
    mounted = shutil.which("mount") and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "headscan-test",
                                                        str(folder)], capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_real_mount_point_is_filled_when_empty_and_refused_before_any_work_when_it_holds_a_run(tmp_path, tiny_gpt2,
                                                                                                  monkeypatch):
    # replacing a mount point fails (EBUSY), which once came after the whole sweep; an empty one is filled in place
    from click.testing import CliRunner

    from headscan.cli import cli

    sweep = ["sweep", "-m", str(tiny_gpt2), "--limit", "2", "-q", "--device", "cpu", "--bootstrap", "20"]
    with mount_point(tmp_path / "mnt") as mnt, mount_point(tmp_path / "rmnt") as rmnt:
        result = CliRunner().invoke(cli, [*sweep, "--out", str(mnt)])
        assert result.exit_code == 0, result.output
        assert os.path.ismount(mnt) and "run.json" in _files(mnt)
        result = CliRunner().invoke(cli, ["report", str(mnt), "--out", str(rmnt), "--no-models", "-q"])
        assert result.exit_code == 0 and os.path.ismount(rmnt) and "index.html" in _files(rmnt), result.output
        before = {name: (mnt / name).stat().st_mtime_ns for name in _files(mnt)}
        monkeypatch.setattr("headscan.scan.controls.load_model", lambda *a, **k: pytest.fail("loaded a model"))
        said = ("is a mount point that holds files, and a mount point cannot be swapped for a new folder; pass a "
                "folder inside it, or empty it\n")
        result = CliRunner().invoke(cli, [*sweep, "--out", str(mnt), "--overwrite"])
        assert result.exit_code == 1 and result.output == f"Error: {mnt}: {said}", result.output
        result = CliRunner().invoke(cli, ["report", str(mnt), "--out", str(rmnt), "--no-models", "-q", "--overwrite"])
        assert result.exit_code == 1 and result.output == f"Error: {rmnt}: {said}", result.output
        assert {name: (mnt / name).stat().st_mtime_ns for name in _files(mnt)} == before


def test_figures_and_the_default_report_named_after_long_run_names_fit_the_file_system(tmp_path):
    # two runs in folders of 200 characters once built the whole report, then failed on a figure's name
    from matplotlib.figure import Figure

    from headscan.report import report_folder
    from headscan.report.document import Document, Figures, write_folder
    from headscan.report.figures import Pngs
    from headscan.tables import SweepTables

    pngs, long = Pngs(), "difference_" + "b" * 200 + "_" + "a" * 200
    names = [pngs.add(f"{long}_{metric}.png", Figure(figsize=(1, 1))) for metric in ("self", "sep")]
    assert len(set(names)) == 2 and all(len(name) <= 120 and name.endswith(".png") for name in names)
    out = write_folder(Document("t", [Figures(names, "two long names")], dict(pngs)), tmp_path / "r")
    assert _files(out / "figures") == sorted(names) and f"figures/{names[0]}" in (out / "report.md").read_text()
    runs = [SweepTables({}, path=tmp_path / ("a" * 200)), SweepTables({}, path=tmp_path / ("b" * 200))]
    folder = report_folder(runs)
    assert folder.parent == tmp_path and folder.name.endswith("-report") and len(folder.name) <= 120
    check_report_options(top=1, out=folder)  # the default is never refused as too long


def test_a_replaced_folder_keeps_its_mode(tmp_path):
    run = tmp_path / "run"
    folders.publish(run, _fill("run.json"))
    run.chmod(0o750)
    folders.publish(run, _fill("run.json", "heads.parquet"))
    assert _files(run) == ["heads.parquet", "run.json"]
    assert run.stat().st_mode & 0o777 == 0o750


def test_overwrite_names_what_a_run_holds_besides_its_own_files_and_deletes_none_of_it(tmp_path):
    run = tmp_path / "run"
    (run / "state").mkdir(parents=True)
    for name in ("run.json", "heads.parquet", "notes.txt", "thesis.tex"):
        (run / name).write_text(name)
    with pytest.raises(TablesError, match=r"run: holds notes.txt, thesis.tex, which a headscan run does not write"):
        check_out(run, overwrite=True)
    assert _files(run) == ["heads.parquet", "notes.txt", "run.json", "state", "thesis.tex"]


# --- one writer at a time ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def held_by_another_process(out: Path):
    """`out` locked by a second Python process for the length of the block; yields its pid."""
    holder = subprocess.Popen([sys.executable, "-c", "import time\nfrom headscan.tables import folders\n"
                               f"with folders.lock({str(out)!r}):\n    print('held', flush=True)\n    time.sleep(120)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder.pid
    finally:
        holder.send_signal(signal.SIGKILL)  # the hardest way to end: the system still releases its lock
        holder.wait()


def test_a_second_writer_to_one_folder_is_refused_in_one_line_naming_the_first(tmp_path, tiny_gpt2):
    from click.testing import CliRunner

    from headscan.cli import cli

    sweep = ["sweep", "-m", str(tiny_gpt2), "--limit", "2", "-q", "--device", "cpu", "--bootstrap", "20"]
    run, out = tmp_path / "run", tmp_path / "out"
    assert CliRunner().invoke(cli, [*sweep, "--out", str(run)]).exit_code == 0
    with held_by_another_process(out) as pid:
        held = f"another headscan process (pid {pid}) is writing there; wait for it to finish, or choose another --out"
        result = CliRunner().invoke(cli, [*sweep, "--out", str(out)])
        assert result.exit_code == 1 and result.output == f"Error: {out}: {held}\n"
        result = CliRunner().invoke(cli, ["merge", str(run), "--out", str(out)])
        assert result.exit_code == 1 and result.output == f"Error: {out}: {held}\n"
        result = CliRunner().invoke(cli, ["report", str(run), "--out", str(out), "--no-models", "-q"])
        assert result.exit_code == 1 and result.output == f"Error: {out}: {held}\n"
        haystack = tmp_path / "haystack.txt"
        haystack.write_text("hay " * 50)
        result = CliRunner().invoke(cli, ["retrieval", "-m", str(tiny_gpt2), "--haystack", str(haystack), "--out",
                                          str(out), "-q"])
        assert result.exit_code == 1 and result.output == f"Error: {out}: {held}\n"
    assert not out.exists()
    result = CliRunner().invoke(cli, [*sweep, "--out", str(out)])
    assert result.exit_code == 0, result.output  # free again once the holder is gone, killed as it was


def test_a_process_may_hold_its_own_folder_twice(tmp_path):
    with folders.lock(tmp_path / "out"), folders.lock(tmp_path / "out"):
        pass
    with folders.lock(tmp_path / "out"):  # and it is released when the outer block ends
        pass


# --- the partial states beside a run -------------------------------------------------------------------------


def test_a_partial_folder_holding_a_users_files_is_refused_before_any_work_and_kept(tmp_path, tiny_gpt2, monkeypatch):
    # a finished (or restarted) sweep removes OUT.partial whole: it once took whatever else was in it
    from click.testing import CliRunner

    from headscan.cli import cli

    partial = tmp_path / "run.partial"
    (partial / "mystuff").mkdir(parents=True)
    (partial / "notes.txt").write_text("mine")
    (partial / "gpt2.npz").write_text("a state a stopped sweep saved")
    monkeypatch.setattr("headscan.scan.controls.load_model", lambda *a, **k: pytest.fail("loaded a model"))
    for restart in ([], ["--restart"]):
        result = CliRunner().invoke(cli, ["sweep", "-m", str(tiny_gpt2), "--limit", "2", "-q", "--device", "cpu",
                                          "--out", str(tmp_path / "run"), *restart])
        assert result.exit_code == 1 and result.output == (
            f"Error: {partial}: holds mystuff, notes.txt, which a stopped sweep does not keep there, and the sweep "
            f"removes the folder once it finishes; move them out, or choose another --out\n"), result.output
    assert _files(partial) == ["gpt2.npz", "mystuff", "notes.txt"] and not (tmp_path / "run").exists()


def test_a_model_at_a_long_path_keeps_its_shard_state_under_a_name_that_fits(tmp_path, tiny_gpt2):
    # the state file's name is made from the spec: a 240-character folder once failed after the sweep (ENAMETOOLONG)
    import headscan
    from headscan.scan.resume import state_file
    from headscan.scan.state import Shard

    model = tmp_path / ("m" * 240)
    shutil.copytree(tiny_gpt2, model)
    run = headscan.sweep(str(model), ["The cat sat on the mat.", "A dog ran."], out=tmp_path / "part", shard="0/2",
                         bootstrap=20, device="cpu")
    assert [p.name for p in (run.path / "state").iterdir()] == [state_file(str(model), None)]  # as merge reads it
    longest = os.pathconf(tmp_path, "PC_NAME_MAX")  # and a stopped sweep's, saved through a temporary file
    assert len(state_file(str(model), Shard(99, 100)).encode()) + len("..xxxxxxxx.tmp") <= longest
    assert state_file(str(model), None) != state_file(str(model) + "x", None)  # cut short, still apart
