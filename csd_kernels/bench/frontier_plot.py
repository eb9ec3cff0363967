"""The frontier plot: forward passes per image vs each quality measure, one marker per setting (matplotlib)."""

from __future__ import annotations

import numpy as np

FIXED_STYLE = {"ar": ("k", "*"), "sjd": ("tab:red", "s"), "sjd+maximal": ("tab:red", "D"),
               "sjd+gumbel": ("tab:red", "P"), "gsd": ("tab:orange", "X"), "sjd+maximal static": ("tab:purple", "X")}
TAU_MARKERS = ("v", "o", "^", "<", ">", "h")
TREE_COLOUR, TREE_MARKERS = "tab:purple", ("o", "s", "D", "^", "v", "p", "h", "*")  # draft trees: one marker per (K, D)


def plot(result: dict, path: str) -> None:
    """csd: colour = λ, shape = τ, filled = coupled next drafts, purple edge = a draft tree; sjd + tree: purple, one
    shape per tree; grey band = ar's mean ± std; dashed = held-out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    csd = [s for s in result["settings"].values() if s["mode"] == "csd"]
    lambdas = sorted({s["entropy_coef"] for s in csd})
    markers = dict(zip(sorted({s["tvd_threshold"] for s in csd}), TAU_MARKERS))
    colours = dict(zip(lambdas, plt.get_cmap("viridis")(np.linspace(0.0, 0.9, max(len(lambdas), 1)))))
    fig, axes = plt.subplots(1, 2, figsize=(16, 5.2))
    for ax, key, name in ((axes[0], "accuracy", "classifier accuracy (higher is better)"),
                          (axes[1], "frechet", "Fréchet distance to real digits (lower is better)")):
        _panel(ax, result, key, colours, markers)
        ax.set_ylabel(name)
    for lam, colour in colours.items():
        axes[0].plot([], [], "s", color=colour, label=f"csd λ={lam:g}")
    for tau, marker in markers.items():
        axes[0].plot([], [], marker, color="0.4", mfc="none", label=f"csd τ={tau:g}")
    axes[0].plot([], [], "o", color="0.4", label="filled: maximal coupling, hollow: independent")
    axes[1].set_yscale("log")  # a collapsed setting is 100x worse than the rest; keep both readable
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="center right")
    fig.suptitle(f"{result['model']}: forward passes vs quality (mean ± std over {len(result['seeds'])} seeds, "
                 f"{10 * result['per_class']} images each)")
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _panel(ax, result: dict, key: str, colours: dict, markers: dict) -> None:
    ar = result["results"]["ar"][key]
    ax.axhspan(ar["mean"] - ar["std"], ar["mean"] + ar["std"], color="0.85", zorder=0, label="ar mean ± std")
    if result.get("heldout"):
        ax.axhline(result["heldout"][key]["mean"], color="0.3", ls="--", lw=1, label="held-out real digits")
    for label, r in result["results"].items():
        s = result["settings"][label]
        x, y, yerr = r["passes"]["mean"], r[key]["mean"], r[key]["std"]
        if s["mode"] == "csd":
            colour = colours[s["entropy_coef"]]
            face = colour if s["coupling"] != "independent" else "none"
            edge = TREE_COLOUR if s.get("tree") else colour
            ax.errorbar(x, y, yerr=yerr, fmt=markers[s["tvd_threshold"]], mfc=face, mec=edge,
                        ecolor=colour, ms=7, alpha=0.9, lw=0.8)
        elif s.get("tree"):
            trees = sorted({tuple(t["tree"]) for t in result["settings"].values() if t.get("tree")})
            marker = TREE_MARKERS[trees.index(tuple(s["tree"])) % len(TREE_MARKERS)]
            ax.errorbar(x, y, yerr=yerr, fmt=marker, color=TREE_COLOUR, ms=8, lw=0.8, label=label)
        else:
            colour, marker = FIXED_STYLE.get(label, ("0.5", "o"))
            ax.errorbar(x, y, yerr=yerr, fmt=marker, color=colour, ms=9, lw=0.8, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("forward passes per image (log scale)")
    ax.grid(alpha=0.3, which="both")
