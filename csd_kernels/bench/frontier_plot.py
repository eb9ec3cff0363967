"""The frontier plot: forward passes per image vs each of the model's quality measures, one marker per setting
(matplotlib)."""

from __future__ import annotations

import numpy as np

FIXED_STYLE = {"ar": ("k", "*"), "sjd+independent": ("tab:red", "s"), "sjd+maximal": ("tab:red", "D"),
               "sjd+gumbel": ("tab:red", "P"), "gsd": ("tab:orange", "X"), "sjd+maximal static": ("tab:purple", "X")}
TAU_MARKERS = ("v", "o", "^", "<", ">", "h")
TREE_COLOUR, TREE_MARKERS = "tab:purple", ("o", "s", "D", "^", "v", "p", "h", "*")  # draft trees: one marker per (K, D)
GSD_COLOUR = "tab:orange"  # gsd over its group (k, δ): one marker per k, lighter for a larger δ


def spread_of(seeds) -> str:
    """The spread a result states: "std" over several seeds; with one, "se", the standard error over the images."""
    return "se" if len(seeds) == 1 else "std"


def plot(result: dict, path: str) -> None:
    import matplotlib.pyplot as plt

    fig = figure(result)
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def figure(result: dict):
    """One panel per quality measure. csd: colour = λ, shape = τ, filled = coupled next drafts, purple edge = a draft
    tree; sjd + tree: purple, one shape per tree; gsd (k, δ): orange; grey band = ar's mean ± std (one seed: ± its
    standard error over the images); dashed = the model's ceiling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measures = result["measures"]  # the model's quality measures (zoo.Measure as dicts)
    csd = [s for s in result["settings"].values() if s["mode"] == "csd"]
    lambdas = sorted({s["entropy_coef"] for s in csd})
    markers = dict(zip(sorted({s["tvd_threshold"] for s in csd}), TAU_MARKERS))
    colours = dict(zip(lambdas, plt.get_cmap("viridis")(np.linspace(0.0, 0.9, max(len(lambdas), 1)))))
    fig, axes = plt.subplots(1, len(measures), figsize=(8 * len(measures), 5.2), squeeze=False)
    axes = axes[0]
    for ax, m in zip(axes, measures):
        _panel(ax, result, m["name"], colours, markers)
        ax.set_ylabel(f"{m['axis']} ({'higher' if m['higher_is_better'] else 'lower'} is better)")
        if m["log_scale"]:
            ax.set_yscale("log")  # a collapsed setting is 100x worse than the rest; keep both readable
            _plain_numbers(ax.yaxis)
    for lam, colour in colours.items():
        axes[0].plot([], [], "s", color=colour, label=f"csd λ={lam:g}")
    for tau, marker in markers.items():
        axes[0].plot([], [], marker, color="0.4", mfc="none", label=f"csd τ={tau:g}")
    axes[0].plot([], [], "o", color="0.4", label="filled: maximal coupling, hollow: independent")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="center right")
    spread = ("± standard error over the images" if len(result["seeds"]) == 1
              else f"mean ± std over {len(result['seeds'])} seeds")
    fig.suptitle(f"{result['model']}: forward passes vs quality ({spread}, {result['images']} images each)")
    fig.tight_layout(rect=(0, 0, 1 - 3.2 / (8 * len(measures)), 1))
    return fig


def _panel(ax, result: dict, key: str, colours: dict, markers: dict) -> None:
    spread = spread_of(result["seeds"])  # as frontier.answers' band
    ar = result["results"]["ar"][key]
    width = ar.get(spread, ar["std"])
    ax.axhspan(ar["mean"] - width, ar["mean"] + width, color="0.85", zorder=0, label=f"ar mean ± {spread}")
    if result.get("heldout"):
        ax.axhline(result["heldout"][key]["mean"], color="0.3", ls="--", lw=1, label=result["ceiling"])
    for label, r in result["results"].items():
        s = result["settings"][label]
        x, y, yerr = r["passes"]["mean"], r[key]["mean"], r[key].get(spread, r[key]["std"])
        if s["mode"] == "csd":
            colour = colours[s["entropy_coef"]]
            face = colour if s["coupling"] != "independent" else "none"
            edge = TREE_COLOUR if s.get("tree") else colour
            ax.errorbar(x, y, yerr=yerr, fmt=markers[s["tvd_threshold"]], mfc=face, mec=edge,
                        ecolor=colour, ms=7, alpha=0.9, lw=0.8)
        elif s["mode"] == "gsd" and s.get("group_rank") is not None:
            ranks = sorted({t["group_rank"] for t in result["settings"].values() if t.get("group_rank") is not None})
            deltas = sorted({t["group_delta"] for t in result["settings"].values() if t.get("group_delta") is not None})
            shade = 0.35 + 0.65 * deltas.index(s["group_delta"]) / max(len(deltas) - 1, 1)
            ax.errorbar(x, y, yerr=yerr, fmt=TREE_MARKERS[ranks.index(s["group_rank"]) % len(TREE_MARKERS)],
                        color=GSD_COLOUR, alpha=shade, ms=7, lw=0.8, label=label)
        elif s.get("tree"):
            trees = sorted({tuple(t["tree"]) for t in result["settings"].values() if t.get("tree")})
            marker = TREE_MARKERS[trees.index(tuple(s["tree"])) % len(TREE_MARKERS)]
            ax.errorbar(x, y, yerr=yerr, fmt=marker, color=TREE_COLOUR, ms=8, lw=0.8, label=label)
        else:
            colour, marker = FIXED_STYLE.get(label, ("0.5", "o"))
            ax.errorbar(x, y, yerr=yerr, fmt=marker, color=colour, ms=9, lw=0.8, label=label)
    ax.set_xscale("log")
    _plain_numbers(ax.xaxis)
    ax.set_xlabel("forward passes per image (log scale)")
    ax.grid(alpha=0.3, which="both")


RULE_COLOURS = {"csd": "tab:blue", "gsd": "tab:orange", "arsample": "tab:green", "lantern": "tab:brown",
                "lantern++": "tab:pink"}


def plot_rules(result: dict, path: str) -> None:
    """A curve per relaxed rule, one panel per quality measure: every chain setting of the rule as a faint marker, its
    Pareto front (fewer passes, better on every measure; ``result["rule_fronts"]``) joined by a line, error bars the
    std over seeds (one seed: the standard error over the images, as :func:`figure`); ar and the lossless sjd
    settings as reference points, ar's band in grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..config.modes import MODE_TABLE

    measures = result["measures"]
    fronts = result.get("rule_fronts", {})  # frontier.answers (a result saved before the rules: none)
    spread = spread_of(result["seeds"])
    rows = result["results"]
    # the x axis spans the relaxed rules and lossless sjd+maximal (their differences are a few percent); ar, far to
    # the right, is its band
    rule_passes = [rows[label]["passes"]["mean"] for label, s in result["settings"].items()
                   if not s.get("tree") and MODE_TABLE[s["mode"]].rule not in (None, "strict")]
    rule_passes += [rows["sjd+maximal"]["passes"]["mean"]] if "sjd+maximal" in rows else []
    span = (0.97 * min(rule_passes), 1.03 * max(rule_passes)) if rule_passes else None
    fig, axes = plt.subplots(1, len(measures), figsize=(7 * len(measures), 5), squeeze=False)
    for ax, m in zip(axes[0], measures):
        key = m["name"]
        ar = rows["ar"][key]
        width = ar.get(spread, ar["std"])
        ax.axhspan(ar["mean"] - width, ar["mean"] + width, color="0.88", zorder=0,
                   label=f"ar ({rows['ar']['passes']['mean']:.0f} passes) mean ± {spread}")
        for label, s in result["settings"].items():
            rule = MODE_TABLE[s["mode"]].rule
            if not s.get("tree") and rule not in (None, "strict") and label not in fronts.get(rule, ()):
                r = rows[label]
                ax.plot(r["passes"]["mean"], r[key]["mean"], "o", color=RULE_COLOURS.get(rule, "0.5"), alpha=0.25,
                        ms=4)
        for rule, labels in fronts.items():
            xs = [rows[label]["passes"]["mean"] for label in labels]
            ys = [rows[label][key]["mean"] for label in labels]
            es = [rows[label][key].get(spread, rows[label][key]["std"]) for label in labels]
            ax.errorbar(xs, ys, yerr=es, fmt="-o", color=RULE_COLOURS.get(rule, "0.5"), ms=5, lw=1.2, capsize=2,
                        label=f"{rule} ({len(labels)} on its front)")
        for label in ("sjd+maximal",):
            if label in rows:
                colour, marker = FIXED_STYLE.get(label, ("0.3", "s"))
                ax.errorbar(rows[label]["passes"]["mean"], rows[label][key]["mean"],
                            yerr=rows[label][key].get(spread, rows[label][key]["std"]), fmt=marker, color=colour, ms=8,
                            label=f"{label} (lossless)")
        if span is not None:
            ax.set_xlim(*span)
        ax.set_xlabel("forward passes per image")
        ax.set_ylabel(f"{m['axis']} ({'higher' if m['higher_is_better'] else 'lower'} is better)")
        if m["log_scale"]:
            ax.set_yscale("log")
            _plain_numbers(ax.yaxis)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=8)
    shown = ("± standard error over the images" if len(result["seeds"]) == 1
             else f"mean ± std over {len(result['seeds'])} seeds")
    fig.suptitle(f"{result['model']}: each acceptance rule's frontier ({shown}, {result['images']} images each)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
def _plain_numbers(axis) -> None:
    """Tick labels of a log axis as plain numbers (9, 20, 300) on the ticks matplotlib labels (its minor ticks too,
    when the axis spans less than a decade, where its own labels read "9×10⁰")."""
    from matplotlib.ticker import Formatter

    class Plain(Formatter):
        def __init__(self, inner):
            self.inner = inner

        def set_axis(self, axis):
            super().set_axis(axis)
            self.inner.set_axis(axis)

        def set_locs(self, locs):
            self.inner.set_locs(locs)

        def __call__(self, value, pos=None):
            return f"{value:g}" if self.inner(value, pos) else ""

    axis.set_major_formatter(Plain(axis.get_major_formatter()))
    axis.set_minor_formatter(Plain(axis.get_minor_formatter()))
