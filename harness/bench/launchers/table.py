"""The launcher comparison's figures: each launcher's runs summarised by
workload, and the markdown table and notes printed from them (pure).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from harness.bench.common import ratio, stats
from harness.bench.launchers.plan import Workload

MIB = float(1 << 20)


# -- formatting ---------------------------------------------------------------------

def fmt_seconds(s: Optional[float]) -> str:
    if s is None:
        return "–"
    return f"{s:.2f} s" if s < 100 else f"{s:.0f} s"


def fmt_spread(st: Optional[dict]) -> str:
    if not st:
        return "–"
    if st["n"] == 1:
        return "(1 run)"
    return f"{st['min']:.2f}–{st['max']:.2f} s"


def fmt_ratio(r: Optional[float]) -> str:
    if r is None:
        return "–"
    return f"{r:.1f}×" if r < 100 else f"{r:.0f}×"


def fmt_mib(b: Optional[float]) -> str:
    return "–" if b is None else f"{b:.0f}"


def fmt_over_t(x: Optional[float], seen: bool = True) -> str:
    """A detection time past T as ``T + 0.05 s`` (or ``T − 1.20 s``)."""
    if not seen:
        return "before the hang began"
    if x is None:
        return "–"
    sign = "+" if x >= 0 else "−"
    return f"T {sign} {abs(x):.2f} s"


def fmt_culprits(per_run: Sequence[Optional[Sequence[int]]], expected: int) -> str:
    """Whom the reports blamed, over the runs: ``yes (worker 1)`` when every
    run named exactly the worker at fault, ``ambiguous (workers 0,1)`` when it
    was among several named, ``no`` when nobody was named."""
    runs = [tuple(sorted(c)) for c in per_run if c is not None]
    if not runs:
        return "–"
    if all(c == (expected,) for c in runs):
        return f"yes (worker {expected})"
    if all(expected in c for c in runs) and len(set(runs)) == 1:
        return f"ambiguous (workers {','.join(map(str, runs[0]))})"
    if not any(runs):
        return "no"
    exact = sum(1 for c in runs if c == (expected,))
    among = sum(1 for c in runs if expected in c and c != (expected,))
    return f"exact {exact}/{len(runs)}, among several {among}/{len(runs)}"


def fmt_bool_runs(values: Sequence[Optional[bool]]) -> str:
    """``yes``/``no`` when all runs agree, else ``2/3``."""
    v = [x for x in values if x is not None]
    if not v:
        return "–"
    if all(v):
        return "yes"
    if not any(v):
        return "no"
    return f"{sum(v)}/{len(v)}"


# -- summary and table ---------------------------------------------------------------

def summarize(runs: List[dict], launchers: Sequence[str], workloads: Sequence[int]) -> dict:
    """``{launcher: {str(workload): figures}}`` from the raw runs.

    Warm figures come from the ok, non-cold runs; a launcher's cold run is
    reported as ``cold_s`` under the workload it ran.
    """
    out: dict = {}
    for name in launchers:
        out[name] = {}
        for w in workloads:
            mine = [r for r in runs if r["launcher"] == name and r["workload"] == w]
            warm = [r for r in mine if not r.get("cold") and r.get("ok")]
            cold = [r for r in mine if r.get("cold")]
            if not mine:
                continue
            fig = {
                "runs": len([r for r in mine if not r.get("cold")]),
                "failed": len([r for r in mine if not r.get("ok")]),
                "wall": stats([r.get("wall_s") for r in warm]),
                "cold_s": cold[0].get("wall_s") if cold else None,
                "cold_ok": cold[0].get("ok") if cold else None,
            }
            # Time inside the workload function (slowest worker): the same work
            # under every launcher; wall minus this is the launcher's own cost.
            fig["fn"] = stats([r.get("fn_s") for r in warm])
            pss = stats([r["pss_bytes"] / MIB for r in warm if r.get("pss_bytes")])
            fig["pss_mib"] = pss["median"] if pss else None
            if any("gone_after_report_s" in r for r in mine):
                fig["detection_over_T"] = stats([r.get("detection_over_T_s") for r in warm])
                fig["report_after_hang"] = stats([r.get("report_after_hang_s") for r in warm])
                fig["hang_start_seen"] = [r.get("hang_start_seen") for r in warm]
                fig["named_culprit"] = [r.get("named_culprit") for r in warm]
                fig["culprits"] = [r.get("culprits") for r in warm]
                fig["stack_dumped"] = [r.get("stack_dumped") for r in warm]
                fig["gone_after_report"] = stats([r.get("gone_after_report_s") for r in warm])
                fig["gone_never"] = len([r for r in warm if r.get("gone_after_report_s") is None])
                delays = [r.get("detection_delay_s") for r in warm if "detection_delay_s" in r]
                if delays:
                    fig["detection_delay"] = stats(delays)
            out[name][str(w)] = fig
    for name in launchers:
        for w, fig in out[name].items():
            ref = out.get("harness", {}).get(w, {}).get("wall")
            mine = fig.get("wall")
            fig["ratio_vs_harness"] = ratio(mine and mine["median"], ref and ref["median"])
            ref_cold = out.get("harness", {}).get(w, {}).get("cold_s")
            fig["cold_ratio_vs_harness"] = ratio(fig.get("cold_s"), ref_cold)
    return out


TABLE_HEADER = ("| launcher | workload | median | spread (min–max) | vs harness | cold | "
                "workers' PSS MiB | hang reported | culprit named | stack | gone after report |")


def render_table(summary: dict, workloads: Dict[int, Workload]) -> str:
    lines = [TABLE_HEADER, "|" + "---|" * TABLE_HEADER.count(" | ") + "---|"]
    numbers = sorted({int(w) for per in summary.values() for w in per})
    for w in numbers:
        for name, per in summary.items():
            fig = per.get(str(w))
            if fig is None:
                continue
            wall = fig.get("wall")
            wl = workloads.get(w)
            title = f"{w}: {wl.title}" if wl else str(w)
            if fig["failed"]:
                title += f" ({fig['failed']} failed)"
            if "gone_after_report" in fig:
                seen_runs = fig["hang_start_seen"]
                seen = any(seen_runs)
                det = fig.get("detection_over_T")
                gone = fig.get("gone_after_report")
                gone_txt = fmt_seconds(gone and gone["max"]) + (" (max)" if gone and gone["n"] > 1 else "")
                if fig.get("gone_never"):
                    gone_txt = f"{fig['gone_never']} run(s) left workers alive"
                hang_txt = fmt_over_t(det and det["median"], seen)
                if seen and not all(seen_runs):
                    hang_txt += (f" ({len(seen_runs) - sum(map(bool, seen_runs))}/{len(seen_runs)}"
                                 f" before the hang began)")
                delay = fig.get("detection_delay")
                if delay:
                    # The harness's own figure: declared this long past T after
                    # the last progress it saw.
                    hang_txt += f" (declared T + {delay['median']:.2f} s)"
                hang = (hang_txt,
                        fmt_culprits(fig["culprits"], wl.skip[0] if wl and wl.skip else 1),
                        fmt_bool_runs(fig["stack_dumped"]),
                        gone_txt)
            else:
                hang = ("", "", "", "")
            cells = (name, title, fmt_seconds(wall and wall["median"]), fmt_spread(wall),
                     fmt_ratio(fig.get("ratio_vs_harness")), fmt_seconds(fig.get("cold_s")),
                     fmt_mib(fig.get("pss_mib"))) + hang
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_notes(summary: dict, extra: dict, notes: Dict[str, str]) -> str:
    """The notes under the table: ``notes``' line of each launcher in the
    summary (its ``note``), then what the figures are."""
    out = [f"- {notes[name]}" for name in summary if name in notes]
    out.append("- median/spread: warm runs only; workloads 4 and 5's are launch to report. "
               "hang reported: from the moment the hang began (the skipping worker's loop end). "
               "PSS: summed over the workers, each measured as its loop ends "
               "(forkserver/runner-process share not included: "
               + ", ".join(f"{k} {fmt_mib(v)} MiB" for k, v in extra.get("overhead_pss_mib", {}).items())
               + ").")
    if extra.get("launcher_startup_s"):
        out.append("- start-up before the first run, not in 'cold': " + ", ".join(
            f"{k} {fmt_seconds(v)}" for k, v in extra["launcher_startup_s"].items()) + ".")
    return "\n".join(out)
