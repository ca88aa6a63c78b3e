"""The documentation's generated blocks (metrics, tables, architectures, this layout), regenerated from the code.

Each block sits between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` in the page `PAGES` names.
``python -m headscan.docs`` rewrites every page; tests/test_docs.py fails when one has drifted."""

import importlib
import re
import sys
from pathlib import Path

from .metrics import definitions_markdown
from .metrics.null_policy import null_policy_markdown
from .tables import tables_markdown

ROOT = Path(__file__).resolve().parents[1]

# The page holding each generated block, relative to the repository root.
PAGES = {
    "metrics": "docs/metrics.md",
    "nulls": "docs/controls.md",
    "tables": "docs/tables.md",
    "architectures": "docs/architectures.md",
    "layout": "docs/layout.md",
}


def blocks() -> dict[str, str]:
    """Each generated block by name: ``<!-- NAME:start -->`` ... ``<!-- NAME:end -->``."""
    from .testing.architectures import support_matrix_markdown  # builds no checkpoint; imports transformers

    return {
        "metrics": definitions_markdown(),
        "nulls": null_policy_markdown(),
        "tables": tables_markdown(),
        "architectures": support_matrix_markdown(),
        "layout": layout_markdown(),
    }


def contracts() -> list[dict]:
    """The import-linter contracts of pyproject.toml."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: import-linter brings tomli
        import tomli as tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _summary(module: str) -> str:
    """The first line of a module's docstring: what it does."""
    doc = importlib.import_module(f"headscan.{module}").__doc__ or ""
    return doc.strip().splitlines()[0].strip()


def layout_markdown() -> str:
    """The package's folders and modules as a table, one row each, top layer first: what each does (its
    docstring's first line) and what it may import: the layers below it in the layers contract, less what a
    forbidden contract takes away."""
    found = contracts()
    layers = next(c for c in found if c["type"] == "layers")["layers"]
    forbidden = [c for c in found if c["type"] == "forbidden"]
    tiers = [re.split(r"\s*[|:]\s*", layer) for layer in layers]
    rows = ["| in `headscan/` | what it does | may import |", "|---|---|---|"]
    for depth, tier in enumerate(tiers):
        below = [name for lower in tiers[depth + 1 :] for name in lower]
        for name in tier:
            banned = {
                m.removeprefix("headscan.")
                for c in forbidden
                if f"headscan.{name}" in c["source_modules"]
                for m in c["forbidden_modules"]
            }
            allowed = [m for m in below if m not in banned]
            label = f"`{name}/`" if (ROOT / "headscan" / name).is_dir() else f"`{name}.py`"
            rows.append(f"| {label} | {_summary(name)} | {', '.join(f'`{m}`' for m in allowed) or 'nothing'} |")
    return "\n".join(rows) + "\n"


def pattern(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- {name}:start -->\n)(.*?)(<!-- {name}:end -->)", re.S)


def update_markdown(path: Path, generated: dict[str, str] | None = None) -> bool:
    """Rewrite whichever generated blocks the Markdown file `path` holds; True when one changed."""
    generated = blocks() if generated is None else generated
    text = path.read_text()
    updated = text
    for name, body in generated.items():
        updated = pattern(name).sub(lambda m, body=body: m.group(1) + body + m.group(3), updated)
    if updated != text:
        path.write_text(updated)
    return updated != text


def update_pages(root: Path = ROOT) -> dict[Path, bool]:
    """Rewrite the generated blocks of every page in `PAGES` (built once); each page and whether it changed."""
    generated = blocks()
    return {root / page: update_markdown(root / page, generated) for page in sorted(set(PAGES.values()))}


if __name__ == "__main__":
    if len(sys.argv) > 1:
        changed = {Path(arg): update_markdown(Path(arg)) for arg in sys.argv[1:]}
    else:
        changed = update_pages()
    for page, was in changed.items():
        print(f"{page}: {'updated' if was else 'already up to date'}")
