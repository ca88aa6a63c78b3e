"""What a patching run says, in a few lines: per model, how well it does the task, the heads that carry the
logit difference (exact denoising, with 95% intervals over pairs), AtP's agreement with them, and the paths
that carry it (`headscan.scan.patching` makes the tables)."""

from __future__ import annotations

import pandas as pd

__all__ = ["patching_summary", "top_patched"]


def top_patched(frame: pd.DataFrame, method: str = "denoise", k: int = 5) -> pd.DataFrame:
    """The `k` heads of each model with the largest fraction restored (or destroyed) by `method`, every
    position at once."""
    rows = frame[(frame["method"] == method) & (frame["target"] == "fraction") & frame["position"].isna()]
    return (rows.sort_values(["model", "value", "layer", "head"], ascending=[True, False, True, True], kind="stable")
            .groupby("model", sort=False).head(k))


def _interval(row) -> str:
    return f"{row.value:.2f} [{row.ci_low:.2f}, {row.ci_high:.2f}]"


def patching_summary(result) -> str:
    """Lines for the terminal: per model, its pairs, top heads and AtP's recall, then its top paths."""
    frame = result["patching"]
    lines = []
    for described in result.provenance.models:
        about = described.extra.get("patching", {})
        name = described.name
        top = top_patched(frame[frame["model"] == name])
        lines.append(f"{name}: {about.get('clean_right', '?')} of {about.get('pairs', '?')} clean prompts right "
                     f"(mean LD clean {about.get('mean_logit_difference', {}).get('clean', float('nan')):.2f}, "
                     f"corrupted {about.get('mean_logit_difference', {}).get('corrupted', float('nan')):.2f})")
        lines.append("  fraction of the logit difference restored (denoising): "
                     + ", ".join(f"{r.label} {_interval(r)}" for r in top.itertuples()))
        for key, name in (("denoise", "AtP"), ("atp_star_denoise", "AtP*")):
            recall = (about.get("atp_recall") or {}).get(key)
            if recall:
                lines.append(f"  {name} (a screen): Spearman {recall['spearman']:.2f} with exact denoising; recall "
                             f"of its top 10 {recall['top_10']}, top 20 {recall['top_20']}")
    if "paths" in result.frames:
        paths = result["paths"]
        paths = paths[paths["target"] == "fraction"].sort_values("value", ascending=False, kind="stable").head(5)
        lines.append("paths (fraction restored through the receiver's q, k or v): " + ", ".join(
            f"{r.model} {r.sender_label}>{r.label}:{r.path} {_interval(r)}" for r in paths.itertuples()))
    return "\n".join(lines)
