"""Head families: which heads attend alike (similarity.parquet), laid out in two dimensions and cut into clusters,
and the pattern type of each head in Kovaleva et al.'s (2019) sense, read off heads.parquet.

- `divergences`: one model's mean Jensen-Shannon divergences (nats) as a square matrix, heads in (layer, head)
  order.
- `classical_mds`: Torgerson's classical MDS in numpy, deterministic: double-centre ``-1/2 J D^2 J``, keep the
  eigenvectors of the largest eigenvalues, each axis's sign fixed so that its coordinate of largest magnitude is
  positive. It embeds the *Jensen-Shannon distance* ``sqrt(js_mean)``: the square root of a mean of JS
  divergences is a metric (Endres and Schindelin 2003; a root-mean-square of metrics), which classical MDS
  assumes, while the divergence itself breaks the triangle inequality. Clark et al. ran metric SMACOF
  (sklearn's, 5 random starts) on the summed divergences; their picture and this one agree in who sits near
  whom, not in the coordinates.
- `average_linkage`: agglomerative clustering with average linkage (UPGMA, scipy's) on the divergences, cut
  where the average divergence between two clusters would pass `cut` nats (`CLUSTER_CUT`); deterministic,
  clusters numbered by their first head. headscan's addition: Clark et al.
  show the map and do not cluster.
- `pattern_types`: each head's type, headscan's rule over its point estimates (`PATTERN_RULE`).

This module draws nothing and loads no model; it imports no torch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.cluster import hierarchy

from ..errors import TablesError

__all__ = ["CLUSTER_CUT", "PATTERN_THRESHOLDS", "REACH", "PATTERN_RULE", "divergences", "classical_mds", "average_linkage",
           "pattern_types", "head_map", "clusters", "closest_across"]

# Where the clustering stops: two clusters whose heads differ by more than this mean JS divergence on average stay
# apart. ln 2 = 0.693 is the most two rows can differ. On 64 EWT sentences the median pair of heads differs by 0.22
# nats (minilm and smollm2 alike) and 0.2 already joins 157 of smollm2's heads (its sink heads) into one cluster;
# 0.1, about the lowest tenth of the pairs, keeps families of a few to a few dozen heads.
CLUSTER_CUT = 0.1

PATTERN_THRESHOLDS = {"vertical": 0.5, "diagonal": 0.5, "mixed": 0.5, "mixed_each": 0.2}
REACH = 2  # the diagonal type's offsets: -REACH .. +REACH (Kovaleva et al.'s diagonals: the next, previous tokens)
PATTERN_RULE = (
    "headscan's rule on each head's point estimates (heads.parquet): sink = `first_token` + `sep` (`sep` 0 where "
    "the model has none), offset = the largest share at one offset from -{reach} to +{reach} (offsets.parquet; "
    "`prev_token`, `self` and `next_token` without it; a causal model has no positive offsets); **vertical** if sink >= {vertical:g}; else **diagonal** if offset >= {diagonal:g}; else "
    "**vertical+diagonal** if sink + offset >= {mixed:g} with each >= {mixed_each:g}; else **heterogeneous**. "
    "Kovaleva et al.'s **block** type (attention within one sentence of a sentence pair) is not assigned: headscan "
    "has no within-segment metric, and its segments are single sentences unless packed."
).format(reach=REACH, **PATTERN_THRESHOLDS)


def divergences(similarity: pd.DataFrame, model: str) -> tuple[pd.DataFrame, np.ndarray]:
    """The heads of `model` in (layer, head) order, (head,) rows of layer, head and label, and its mean divergences
    as a (head, head) matrix, rows and columns in that order; a pair the table lacks is NaN."""
    part = similarity[similarity["model"] == model]
    if part.empty:
        raise TablesError(f"similarity.parquet has no rows of {model!r}; sweep it with --similarity-sample N")
    heads = (part[["layer", "head", "label"]].drop_duplicates().sort_values(["layer", "head"]).reset_index(drop=True))
    index = {(layer, head): n for n, (layer, head) in enumerate(zip(heads["layer"], heads["head"]))}
    matrix = np.full((len(heads), len(heads)), np.nan)
    rows = np.array([index[key] for key in zip(part["layer"], part["head"])])
    columns = np.array([index.get(key, -1) for key in zip(part["other_layer"], part["other_head"])])
    kept = columns >= 0
    matrix[rows[kept], columns[kept]] = part["value"].to_numpy(dtype=float)[kept]
    return heads, matrix


def classical_mds(distances: np.ndarray, dims: int = 2) -> np.ndarray:
    """(point, dims) coordinates whose Euclidean distances best match `distances` (point, point) in Torgerson's
    sense; deterministic, each axis's sign fixed (its coordinate of largest magnitude positive, the first one on
    a tie). Axes with no positive eigenvalue are 0.

    >>> d = np.array([[0, 3, 4], [3, 0, 5], [4, 5, 0]], dtype=float)  # a 3-4-5 right triangle
    >>> x = classical_mds(d)
    >>> np.allclose(np.linalg.norm(x[:, None] - x[None], axis=-1), d)
    True
    """
    d = np.asarray(distances, dtype=float)
    n = d.shape[0]
    if d.shape != (n, n) or not np.isfinite(d).all():
        raise TablesError(f"classical MDS needs a finite square matrix of distances, got shape {d.shape}"
                          f"{'' if np.isfinite(d).all() else ' with NaN'}")
    centre = np.eye(n) - 1.0 / n
    b = -0.5 * centre @ (d ** 2) @ centre
    b = (b + b.T) / 2  # symmetric to the last bit, for eigh
    values, vectors = np.linalg.eigh(b)  # ascending
    order = np.argsort(-values, kind="stable")[:dims]
    coords = vectors[:, order] * np.sqrt(np.clip(values[order], 0, None))  # (point, dims)
    if coords.shape[1] < dims:
        coords = np.hstack([coords, np.zeros((n, dims - coords.shape[1]))])
    pivot = np.abs(coords).argmax(0)  # (dims,): the first of the largest magnitudes
    signs = np.where(coords[pivot, np.arange(dims)] < 0, -1.0, 1.0)
    return coords * signs


def average_linkage(divergence: np.ndarray, cut: float = CLUSTER_CUT) -> np.ndarray:
    """(point,) cluster numbers from average-linkage agglomerative clustering of `divergence` (point, point):
    the two clusters of smallest average pairwise divergence merge while it is at most `cut`. scipy's UPGMA
    (`scipy.cluster.hierarchy.linkage`, cut by `fcluster` at the distance `cut`); clusters are numbered 0, 1, ...
    in the order of their first point. Where two candidate merges tie exactly, scipy's order decides.

    >>> d = np.array([[0, .01, .6, .6], [.01, 0, .6, .6], [.6, .6, 0, .02], [.6, .6, .02, 0]])
    >>> average_linkage(d, cut=0.2).tolist()
    [0, 0, 1, 1]
    """
    d = np.asarray(divergence, dtype=float)
    n = d.shape[0]
    if d.shape != (n, n) or not np.isfinite(d).all():
        raise TablesError(f"clustering needs a finite square matrix of divergences, got shape {d.shape}")
    if n < 2:
        return np.zeros(n, dtype=int)
    upper = np.triu_indices(n, 1)
    condensed = (d[upper] + d.T[upper]) / 2  # (n (n - 1) / 2,): the symmetrised pairs, as squareform orders them
    tree = hierarchy.linkage(condensed, method="average")
    labels = hierarchy.fcluster(tree, t=cut, criterion="distance")  # merges at heights <= cut
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=int)
    rank[np.argsort(first)] = np.arange(len(first))  # numbered by their first point
    return rank[inverse]


def pattern_types(heads: pd.DataFrame, offsets: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (model, layer, head) of `heads` (heads.parquet): ``sink``, ``offset`` (see `PATTERN_RULE`; from
    `offsets`, offsets.parquet, where given) and ``pattern_type``, one of "vertical", "diagonal",
    "vertical+diagonal", "heterogeneous".

    >>> heads = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 0, 1, 1, 2, 2],
    ...     "metric": ["first_token", "prev_token"] * 3, "value": [0.9, 0.0, 0.1, 0.8, 0.3, 0.25]})
    >>> pattern_types(heads)["pattern_type"].tolist()
    ['vertical', 'diagonal', 'vertical+diagonal']
    """
    wanted = ["first_token", "sep", "prev_token", "self", "next_token"]
    part = heads[heads["metric"].isin(wanted)]
    wide = part.pivot_table(index=["model", "layer", "head"], columns="metric", values="value", aggfunc="first",
                            sort=False).reindex(columns=wanted)
    sink = wide["first_token"].fillna(0) + wide["sep"].fillna(0)
    offset = wide[["prev_token", "self", "next_token"]].max(axis=1, skipna=True).fillna(0)
    if offsets is not None and not offsets.empty:
        near = offsets[offsets["offset"].abs() <= REACH].groupby(["model", "layer", "head"], sort=False)["value"].max()
        offset = pd.concat([offset, near.reindex(offset.index)], axis=1).max(axis=1, skipna=True).fillna(0)
    t = PATTERN_THRESHOLDS
    kind = np.select([sink >= t["vertical"], offset >= t["diagonal"],
                      (sink + offset >= t["mixed"]) & (sink >= t["mixed_each"]) & (offset >= t["mixed_each"])],
                     ["vertical", "diagonal", "vertical+diagonal"], "heterogeneous")
    return pd.DataFrame({"sink": sink, "offset": offset, "pattern_type": kind}, index=wide.index).reset_index()


def head_map(similarity: pd.DataFrame, model: str, cut: float = CLUSTER_CUT) -> pd.DataFrame:
    """One row per head of `model`: layer, head, label, its MDS coordinates ``x``, ``y`` (of the JS distance) and
    its ``cluster`` (average linkage on the divergences, cut at `cut` nats), with ``cluster_size``."""
    heads, matrix = divergences(similarity, model)
    if np.isnan(matrix).any():
        raise TablesError(f"similarity.parquet: {model!r} lacks {int(np.isnan(matrix).sum())} pairs of heads; "
                          f"sweep it again with --similarity-sample N")
    coords = classical_mds(np.sqrt(np.clip(matrix, 0, None)))
    cluster = average_linkage(matrix, cut)
    sizes = np.bincount(cluster)
    return heads.assign(model=model, x=coords[:, 0], y=coords[:, 1], cluster=cluster, cluster_size=sizes[cluster])


def clusters(mapped: pd.DataFrame, similarity: pd.DataFrame) -> pd.DataFrame:
    """One row per cluster of two or more heads in `mapped` (`head_map`'s rows, any models): its members and the
    mean divergence between them (nats), largest clusters first."""
    rows = []
    for (model, number), part in mapped[mapped["cluster_size"] > 1].groupby(["model", "cluster"], sort=False):
        labels = set(part["label"])
        pairs = similarity[(similarity["model"] == model) & similarity["label"].isin(labels)
                           & similarity["other_label"].isin(labels) & (similarity["label"] != similarity["other_label"])]
        rows.append({"model": model, "cluster": int(number), "heads": len(part),
                     "members": ", ".join(part.sort_values(["layer", "head"])["label"]),
                     "layers": ", ".join(str(x) for x in sorted(set(part["layer"]))),
                     "mean_js": float(pairs["value"].mean())})
    frame = pd.DataFrame(rows, columns=["model", "cluster", "heads", "members", "layers", "mean_js"])
    return frame.sort_values(["model", "heads", "cluster"], ascending=[True, False, True], kind="stable",
                             key=lambda c: c.map({m: i for i, m in enumerate(dict.fromkeys(mapped["model"]))})
                             if c.name == "model" else c).reset_index(drop=True)


def closest_across(across: pd.DataFrame, top: int = 10) -> pd.DataFrame:
    """The `top` pairs of heads of smallest divergence for each pair of models in `across` (similarity_across
    rows): model, label, other_model, other_label, value (nats), count (word queries).

    >>> across = pd.DataFrame({"model": "a", "label": ["L0H0", "L0H1"], "other_model": "b",
    ...                        "other_label": "L3H2", "value": [0.3, 0.1], "count": 40.0})
    >>> closest_across(across, top=1)[["label", "other_label", "value"]].to_dict("records")
    [{'label': 'L0H1', 'other_label': 'L3H2', 'value': 0.1}]
    """
    columns = ["model", "label", "other_model", "other_label", "value", "count"]
    ranked = across[across["value"].notna()].sort_values("value", kind="stable")
    return ranked.groupby(["model", "other_model"], sort=False).head(top)[columns].reset_index(drop=True)
