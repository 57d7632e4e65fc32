"""The house style of every figure :mod:`plots` draws: sizes, fonts, one colour per decoder family
(:class:`Style`), wrapped titles, legends under the axes, stacked panels per run group, and :func:`save`
(PNG and PDF)."""

from __future__ import annotations

import colorsys
import math
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

#: Width of a one-column figure and of a two-panel (full-width) figure, inches.
COLUMN_WIDTH_IN = 3.5
PAGE_WIDTH_IN = 7.0
#: Font sizes: text, then tick labels and legends.
FONT, SMALL = 7, 6
#: One colour per decoder family (Okabe-Ito, colour-blind safe, and greys for the references), matched by the
#: longest family name a decoder's name starts with (``speculative_tuned`` -> ``speculative``).
FAMILY_COLOURS = {"vanilla": "#7f7f7f", "hf_greedy": "#3f3f3f", "speculative": "#0072B2", "hf_assisted": "#56B4E9",
                  "prompt_lookup": "#009E73", "lookahead": "#E69F00", "ouroboros": "#D55E00",
                  "opt_tree": "#CC79A7", "fixed_tree": "#882255"}
#: Colours of decoders outside the families above, in order of appearance (Okabe-Ito's yellow last: it
#: vanishes on white paper).
OTHER_COLOURS = ("#000000", "#8c564b", "#17becf", "#9467bd", "#bcbd22", "#F0E442")


#: The file beside the figures that holds their captions (titles are kept out of the images).
CAPTIONS_FILE = "captions.md"


def save(fig: Any, out_dir: str | Path, name: str) -> list[Path]:
    """Write ``<out_dir>/<name>.png`` (300 dpi) and ``.pdf`` and the figure's caption (:func:`caption`) into
    ``<out_dir>/captions.md``; closes the figure. Returns the paths of the images."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    fig.savefig(paths[0], dpi=300, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    record_caption(out, name, caption(fig))
    plt.close(fig)
    return paths


def record_caption(out_dir: str | Path, name: str, text: str | None) -> None:
    """Set (``text``) or remove (None) figure ``name``'s line in ``<out_dir>/captions.md``: one line per figure,
    ``- **name** (name.png, name.pdf): caption``, in the order the figures were first written."""
    path = Path(out_dir) / CAPTIONS_FILE
    lines = path.read_text().splitlines() if path.is_file() else []
    entries = {m.group(1): line for line in lines if (m := re.match(r"- \*\*(.+?)\*\* \(", line))}
    if text is None:
        entries.pop(name, None)
    else:
        entries[name] = f"- **{name}** ({name}.png, {name}.pdf): {' '.join(str(text).split())}"
    if entries:
        path.write_text("# Figures\n\n" + "\n".join(entries.values()) + "\n")
    elif path.is_file():
        path.unlink()


def palette(n: int) -> list[tuple[float, float, float, float]]:
    """``n`` distinct colours for series that are not decoders (``tab10`` up to 10, ``tab20`` up to 20, else
    evenly spaced along ``turbo``)."""
    if n <= 10:
        return [plt.get_cmap("tab10")(i) for i in range(n)]
    if n <= 20:
        return [plt.get_cmap("tab20")(i) for i in range(n)]
    return [tuple(c) for c in plt.get_cmap("turbo")(np.linspace(0.03, 0.97, n))]


def family(name: str) -> str | None:
    """The decoder family of a configuration's name or label (longest prefix in :data:`FAMILY_COLOURS`)."""
    hits = [f for f in FAMILY_COLOURS if str(name).startswith(f)]
    return max(hits, key=len) if hits else None


def shade(colour: str, i: int, n: int) -> tuple[float, float, float]:
    """The ``i``-th of ``n`` shades of ``colour``: the colour itself first, then darker and lighter ones."""
    if n == 1 or i == 0:
        return mcolors.to_rgb(colour)
    h, lum, sat = colorsys.rgb_to_hls(*mcolors.to_rgb(colour))
    steps = [-0.18, 0.18, -0.3, 0.3, -0.09, 0.09, -0.38, 0.38]
    return colorsys.hls_to_rgb(h, min(0.92, max(0.08, lum + steps[(i - 1) % len(steps)])), sat)


@dataclass
class Style:
    """How a report draws its configurations, the same in every figure: a colour and a display name per label.

    Attributes:
        colours: label -> colour (:meth:`of` builds them: a decoder family's colour, shaded per configuration).
        names: label -> display name (the label with its settings: ``speculative_tuned (gamma=8)``).
    """

    colours: dict[str, Any] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, agg: pd.DataFrame) -> "Style":
        """The style of an aggregate's labels (its ``label``, ``decoder`` and ``settings`` columns)."""
        if agg is None or agg.empty or "label" not in agg:
            return cls()
        labels = list(dict.fromkeys(agg["label"].astype(str)))
        decoders = dict(zip(agg["label"].astype(str), agg["decoder"].astype(str))) if "decoder" in agg else {}
        by_family: dict[str, list[str]] = {}
        for lab in labels:
            by_family.setdefault(family(decoders.get(lab, lab)) or decoders.get(lab, lab), []).append(lab)
        colours, others = {}, iter(OTHER_COLOURS * 4)
        for fam, labs in by_family.items():
            base = FAMILY_COLOURS.get(fam) or next(others)
            for i, lab in enumerate(labs):
                colours[lab] = shade(base, i, len(labs))
        names = {}
        settings = dict(zip(agg["label"].astype(str), agg["settings"])) if "settings" in agg else {}
        for lab in labels:
            s = settings.get(lab)
            names[lab] = f"{lab} ({s})" if isinstance(s, str) and s and "(" not in lab else lab
        return cls(colours, names)

    def colour(self, label: str) -> Any:
        if label not in self.colours:  # a label the report's aggregate did not have: a stable fallback
            fam = family(label)
            self.colours[label] = mcolors.to_rgb(FAMILY_COLOURS[fam]) if fam else \
                OTHER_COLOURS[len(self.colours) % len(OTHER_COLOURS)]
        return self.colours[label]

    def name(self, label: str, width: int = 44) -> str:
        """The display name, wrapped to lines of ``width`` characters (an axis label in a one-column figure)."""
        return "\n".join(textwrap.wrap(self.names.get(label, label), width, break_long_words=False,
                                        subsequent_indent="  ")) or label


def fmt_tick(v: Any) -> str:
    """A hyper-parameter value as written in a config: ``3`` not ``3.0``."""
    if isinstance(v, (float, np.floating)):
        if math.isnan(v):
            return "null"
        if float(v).is_integer():
            return str(int(v))
    return str(v)


def wrap_text(text: str, width_in: float, size: float = SMALL) -> str:
    """``text`` wrapped to fit ``width_in`` inches at font ``size`` (about 0.55 em per character)."""
    chars = max(20, int(width_in * 72 / (0.55 * size)))
    return "\n".join(textwrap.wrap(text, chars, break_long_words=False)) if text else ""


def set_titles(fig: Any, title: str, subtitle: str) -> None:
    """Give ``fig`` its caption: ``title``, then what was measured (``subtitle``). Kept outside the image, as a paper
    sets it (under the figure, in the text's font): :func:`caption` reads it, :func:`save` writes it into
    ``captions.md`` beside the files."""
    text = f"{title.rstrip('.')}. {subtitle.rstrip('.')}." if subtitle else f"{title.rstrip('.')}."
    fig.set_label(" ".join(text.split()))  # one line: captions.md holds one line per figure


def caption(fig: Any) -> str:
    """The caption :func:`set_titles` gave ``fig`` (empty when none)."""
    return str(fig.get_label() or "")


def legend_below(ax: Any, ncol: int = 2, title: str | None = None, handles: Any = None, labels: Any = None,
                  where: str = "center") -> Any:
    """A legend under the figure's axes (``where``: center, left or right), placed by the constrained layout:
    never over the data, never widening the figure."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    return ax.figure.legend(handles, labels, loc=f"outside lower {where}", ncol=ncol, fontsize=SMALL, title=title,
                            title_fontsize=SMALL, frameon=False)


def short_groups(groups: Sequence[str]) -> dict[str, str]:
    """What tells run groups apart: each label without the words all of them share (``humaneval: A / B
    (temperature=0)`` and ``... (temperature=0.7)`` -> ``temperature=0`` and ``temperature=0.7``; ``humaneval: A / B
    (task_version=1.0)`` and ``gsm8k: A / B (task_version=1.1)`` -> ``humaneval (task_version=1.0)`` and ``gsm8k
    (task_version=1.1)``); the whole label where nothing is left, or where two labels would read alike."""
    words = [str(g).split(" ") for g in groups]
    if len(words) < 2:
        return {str(g): str(g) for g in groups}
    common = set.intersection(*(set(w) for w in words))
    out = {}
    for g, w in zip(groups, words):
        short = " ".join(x for x in w if x not in common).strip(" :").replace(": (", " (")
        if short.startswith("(") and short.endswith(")") and short.count("(") == 1:
            short = short[1:-1]
        out[str(g)] = short or str(g)
    if len(set(out.values())) < len(out):  # shortened alike: the labels as they are
        return {str(g): str(g) for g in groups}
    return out


def group_panels(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """One panel per run group, in order, titled with what tells the groups apart (:func:`short_groups`; the
    full labels are in the report); a single group: one untitled panel."""
    if "group" not in frame or frame["group"].nunique() <= 1:
        return [("", frame)]
    titles = short_groups(list(dict.fromkeys(frame["group"].astype(str))))
    return [(titles[str(g)], sub) for g, sub in frame.groupby("group", sort=False)]


def stacked_axes(panels: Sequence[tuple[str, pd.DataFrame]], width_in: float, style: Style, per_row: float = 0.13,
             extra: float = 0.5) -> tuple[Any, Any]:
    """A figure of stacked panels, each as tall as its bars' labels (a wrapped name takes several lines)."""
    heights = [max(1.5, sum(max(1.3, style.name(str(lab)).count("\n") + 1.0)
                            for lab in dict.fromkeys(sub["label"]))) for _, sub in panels]
    fig, axes = plt.subplots(len(panels), 1, layout="constrained", squeeze=False, sharex=True,
                             figsize=(width_in, 0.9 + sum(extra + per_row * h for h in heights)),
                             gridspec_kw={"height_ratios": [extra / per_row + h for h in heights]})
    return fig, axes[:, 0]


def bar_rows(ax: Any, labels: Sequence[str], style: Style) -> np.ndarray:
    """y positions of one bar per label, top to bottom, each row as tall as its (wrapped) name; sets the ticks
    and their labels. Returns the positions."""
    names = [style.name(lab) for lab in labels]
    heights = np.array([max(1.3, n.count("\n") + 1.0) for n in names])
    total = float(heights.sum())
    y = total - (np.cumsum(heights) - heights / 2)
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=SMALL)
    ax.set_ylim(0, total)
    return y
