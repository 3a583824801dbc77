"""Scale searches for the block quantizers: for many groups of values at once, the scale (and
min) that puts them best on an integer grid.

The facts are ggml's reference quantizers' (make_qkx2_quants, make_qx_quants, make_q3_quants and
the IQ4 search): the same candidate scales, weights and acceptance rules. Here each search runs as
array operations over every group together, one candidate at a time, and keeps only what the
caller needs: the codes are recomputed by the caller from the stored (rounded) scales anyway.

Every function takes x as a (groups, n) float32 array and returns float arrays of shape (groups,).
"""
from __future__ import annotations

import numpy as np

GROUP_EPS = np.float32(1e-15)  # a group whose largest |x| is below this is all zero


def signed_absmax(x: np.ndarray) -> np.ndarray:
    """The value of largest magnitude in each row (sign kept), as an (n, 1) column."""
    i = np.abs(x).argmax(axis=1)[:, None]
    return np.take_along_axis(x, i, axis=1)


def _group_absmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each group's signed largest |x|, 1 where the group is all zero; which groups are all zero)."""
    mx = signed_absmax(x)[:, 0]
    zero = np.abs(mx) < GROUP_EPS
    return np.where(zero, 1, mx).astype(np.float32), zero


def _best_scale(fit, iscales) -> np.ndarray:
    """The weighted least-squares scale of the best of the grids `fit(iscale)` gives (sum w x q,
    sum w q^2) for: each grid after the first is kept where it raises (sum w x q)^2 / sum w q^2."""
    iscales = iter(iscales)
    sqx, sq2 = fit(next(iscales))
    scale = _safe_div(sqx, sq2)
    best = scale * sqx
    for iscale in iscales:
        sqx, sq2 = fit(iscale)
        better = (sq2 > 0) & (sqx * sqx > best * sq2)
        scale = np.where(better, _safe_div(sqx, sq2), scale)
        best = np.where(better, scale * sqx, best)
    return scale


def _safe_div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b != 0, a / np.where(b != 0, b, 1), 0)


def _dot32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise sums of a*b in float32 (as ggml sums), returned as float64 for the fits' algebra."""
    return np.einsum("ij,ij->i", a, b).astype(np.float64)


def affine_fit(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int,
               mad: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """x ~ scale * l - neg_min, l in 0..nmax (Q2_K, Q4_K, Q5_K): returns (scale, neg_min >= 0).

    The range [min(x, 0), max(x)] first spans the grid; then nstep + 1 stretched grids
    (nmax + rmin + rdelta * i steps from the best min so far to max(x)) each give codes, for which
    scale and min are the weighted least-squares fit (min kept <= 0). The fit with the least
    weighted squared error (absolute error when `mad`) wins. Sums are float32 (as ggml's) and the
    arrays are reused across candidates: this search is most of `llambda quantize`'s time.
    """
    lo = np.minimum(x.min(axis=1), 0)
    hi = x.max(axis=1)
    sw, swx, swx2 = w.sum(axis=1).astype(np.float64), _dot32(w, x), _dot32(w * x, x)
    l, wl, diff = np.empty_like(x), np.empty_like(x), np.empty_like(x)

    def codes(steps, m):
        """Codes on a grid of `steps` from m to max(x) (m: the current min, as ggml updates it), into l."""
        iscale = (np.float32(steps) * _safe_div(np.float32(1), (hi - m).astype(np.float32))).astype(np.float32)
        np.subtract(x, m[:, None], out=l)
        np.multiply(l, iscale[:, None], out=l)
        np.rint(l, out=l)
        np.clip(l, 0, nmax, out=l)

    def error(s, m, sl, sl2, sxl):
        """The weighted error of codes l under scale s and min m: summed directly for `mad`, else from the
        candidate's sums (float32 sums of 32 terms: their rounding, ~1e-7 of sum(w x^2), is far below the
        error, ~1e-3 of it at 4 bits, so the comparison between candidates holds)."""
        if not mad:
            return s * s * sl2 + m * m * sw + swx2 + 2 * s * m * sl - 2 * s * sxl - 2 * m * swx
        np.multiply(l, s.astype(np.float32)[:, None], out=diff)
        np.add(diff, m.astype(np.float32)[:, None], out=diff)
        np.subtract(diff, x, out=diff)
        np.abs(diff, out=diff)
        return _dot32(w, diff)

    def sums():
        np.multiply(w, l, out=wl)
        return _dot32(w, l), _dot32(wl, l), _dot32(wl, x)

    best_s = ((hi - lo) / np.float32(nmax)).astype(np.float64)
    best_m = lo.astype(np.float64)
    codes(nmax, lo)
    best_e = error(best_s, best_m, *sums())
    for i in range(nstep + 1):
        codes(rmin + rdelta * i + nmax, best_m.astype(np.float32))
        sl, sl2, sxl = sums()
        det = sw * sl2 - sl * sl
        s = _safe_div(sw * sxl - swx * sl, det)
        m = _safe_div(sl2 * swx - sl * sxl, det)
        positive = m > 0          # the format only subtracts a min: refit the scale alone
        s = np.where(positive, _safe_div(sxl, sl2), s)
        m = np.where(positive, 0, m)
        e = error(s, m, sl, sl2, sxl)
        better = (det > 0) & (e < best_e)
        best_s = np.where(better, s, best_s)
        best_m = np.where(better, m, best_m)
        best_e = np.where(better, e, best_e)
    flat = hi == lo
    return np.where(flat, 0, best_s), np.where(flat, -lo, -best_m)


def symmetric_fit(x: np.ndarray, w: np.ndarray, nmax: int) -> np.ndarray:
    """x ~ scale * l, l in -nmax..nmax-1 (Q6_K): the weighted least-squares scale of the best of
    19 grids around the one that puts the largest |x| on -nmax."""
    mx, zero = _group_absmax(x)

    def fit(iscale):
        l = np.clip(np.rint(x * iscale[:, None]), -nmax, nmax - 1)
        wl = w * l
        return _dot32(wl, x), _dot32(wl, l)

    first = -np.float32(nmax) / mx
    scale = _best_scale(fit, (first, *(-np.float32(nmax + 0.1 * k) / mx for k in (*range(-9, 0), *range(1, 10)))))
    return np.where(zero, 0, scale)


def refined_symmetric_fit(x: np.ndarray, nmax: int, rounds: int = 5) -> np.ndarray:
    """x ~ scale * l, l in -nmax..nmax-1 (Q3_K): from the grid that puts the largest |x| on -nmax,
    move one code at a time to where the current fit puts it, keeping each move that raises
    (sum w x l)^2 / sum w l^2 (weights x^2); up to `rounds` passes. Returns the final fit's scale."""
    mx, zero = _group_absmax(x)
    w = x * x
    l = np.clip(np.rint(x * (-np.float32(nmax) / mx)[:, None]), -nmax, nmax - 1).astype(np.float64)
    wx = (w * x).astype(np.float64)
    w64 = w.astype(np.float64)
    slx, sl2 = np.einsum("ij,ij->i", wx, l), np.einsum("ij,ij->i", w64, l * l)
    # value i of every group as one contiguous row: the passes below walk one value at a time
    lt, w64t, wxt, xt = (np.ascontiguousarray(a.T) for a in (l, w64, wx, x))
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(rounds):
            changed = False
            for i in range(x.shape[1]):
                li, wi, wxi = lt[i], w64t[i], wxt[i]
                rest_lx = slx - wxi * li
                rest_l2 = sl2 - wi * li * li
                new = np.clip(np.rint(xt[i] * rest_l2 / rest_lx), -nmax, nmax - 1)
                new_lx = rest_lx + wxi * new
                new_l2 = rest_l2 + wi * new * new
                take = ((rest_lx > 0) & (new != li) & (new_l2 > 0)
                        & (new_lx * new_lx * sl2 > slx * slx * new_l2))
                if take.any():
                    changed = True
                    lt[i] = np.where(take, new, li)
                    slx = np.where(take, new_lx, slx)
                    sl2 = np.where(take, new_l2, sl2)
            if not changed:
                break
    return np.where(zero, 0, _safe_div(slx, sl2))


def nearest_level(v: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Index of the nearest of the ascending integer `levels` for each v (ties to the lower).

    The midpoints of integer levels are multiples of 1/2, so the index depends only on ceil(2v):
    one table lookup instead of a binary search per value.
    """
    mid2 = (levels[1:] + levels[:-1]).astype(np.int64)   # twice the midpoints
    lo, hi = int(mid2[0]), int(mid2[-1])
    table = np.searchsorted(mid2, np.arange(lo, hi + 2) - 1, side="right").astype(np.uint8)
    t = np.ceil(v * np.float32(2))
    np.clip(t, lo, hi + 1, out=t)
    np.nan_to_num(t, copy=False, nan=lo)
    return table[t.astype(np.int32) - lo]


def grid_fit(x: np.ndarray, w: np.ndarray, grid: np.ndarray, ntry: int) -> np.ndarray:
    """x ~ scale * grid[code] on a non-uniform ascending grid (IQ4_NL, IQ4_XS): the weighted
    least-squares scale of the best of the grids that put the largest |x| at either end, the
    negative end moved by -ntry..ntry."""
    levels = grid.astype(np.float32)
    mx, zero = _group_absmax(x)

    def fit(iscale):
        q = levels[nearest_level(x * iscale[:, None], levels)]
        wq = w * q
        return _dot32(wq, x), _dot32(wq, q)

    positive = np.float32(-levels[0]) / mx       # the largest |x| at the positive end
    scale = _best_scale(fit, (positive, *(np.float32(k + levels[0]) / mx for k in range(-ntry, ntry + 1))))
    return np.where(zero, 0, scale)
