"""How the ledger shows values and its summary to people: short numbers, times, stored text
made safe to print, and the lines of ``dpatlas ledger show``."""

from __future__ import annotations

from datetime import datetime, timezone

from dpatlas.core.files import now_utc

SET_CAP_COMMAND = ("dpatlas ledger set-cap --dataset {dataset} --epsilon E --delta X "
                   "--reason TEXT")


def now_text() -> str:
    return now_utc("microseconds")


def iso_time(epoch: float | None) -> str:
    if epoch is None:
        return "never"
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")


def fmt(x: float | None) -> str:
    """Short float: 9.5, 0.1 (not 0.1000000001), 1e-5 (not 1e-05)."""
    if x is None:
        return "none"
    s = f"{x:.10g}"
    if "e" in s:
        mant, exp = s.split("e")
        s = f"{mant}e{'-' if exp.startswith('-') else ''}{exp.lstrip('+-').lstrip('0') or '0'}"
    return s


def display_text(text) -> str:
    """Stored text made safe to print on one line: every non-printable character (newline,
    carriage return, tab, escape, bidi override...) is shown as its escape, so a stored reason
    or id can never forge a line, or a colour, of ``ledger show``."""
    s = "" if text is None else str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else
                   (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
                    if ord(c) < 0x10000 else f"\\U{ord(c):08x}") for c in s)


def one_line(text: str, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[:limit - 3] + "..."


def summary_text(summary: dict) -> str:
    """``ledger show``'s text of :meth:`Ledger.summary`'s document."""
    head = f"privacy-budget ledger at {summary['url']}"
    if not summary["ledger_exists"]:
        return (f"{head}\n  there is no ledger at this URL yet (no ledger tables): "
                f"`{SET_CAP_COMMAND.format(dataset='D')}` creates it")
    lines = [head]
    if not summary["datasets"]:
        lines.append(f"  no datasets yet (set a cap: `{SET_CAP_COMMAND.format(dataset='D')}`)")
    for d in summary["datasets"]:
        lines += _dataset_lines(d)
    return "\n".join(lines)


def _dataset_lines(d: dict) -> list[str]:
    """``ledger show``'s lines for one dataset of :meth:`Ledger.summary`."""
    cap, spent, mine = d["cap"], d["spent"], d["releases"]
    lines = [f"dataset {display_text(d['dataset'])}:"]
    if cap is None:
        lines.append("  lifetime cap: none set")
    else:
        lines.append(f"  lifetime cap per privacy unit: eps={fmt(cap['epsilon'])} "
                     f"delta={fmt(cap['delta'])}")
    if d["cap_changes"]:
        lines.append("  cap changes (UTC):")
    for h in d["cap_changes"]:
        old = ("none" if h["old_epsilon"] is None else
               f"eps={fmt(h['old_epsilon'])} delta={fmt(h['old_delta'])}")
        lines.append(f"    {h['changed_at'][:19]}  {old} -> eps={fmt(h['new_epsilon'])}"
                     f" delta={fmt(h['new_delta'])}  by {display_text(h['actor'])}: "
                     f"{display_text(h['reason'])}")
    lines.append(f"  spent: eps={fmt(spent['epsilon'])} delta={fmt(spent['delta'])} "
                 f"over {len(mine)} release{'s' if len(mine) != 1 else ''} "
                 f"(failed and withdrawn releases included: never refunded)")
    if cap is not None:
        lines.append(f"  left: eps={fmt(d['left']['epsilon'])} "
                     f"delta={fmt(d['left']['delta'])}")
        if d["over_cap"]:
            lines.append("  over the cap: the cap was set below what is spent; no "
                         "release of this dataset can be charged until it is raised")
    if mine:
        w = max(10, *(len(display_text(x["release_id"])) for x in mine))
        lines.append(f"    {'release':<{w}}  {'status':<11}  {'started (UTC)':<19}  "
                     f"{'eps':>10}  {'delta':>10}")
        for x in mine:
            lines.append(f"    {display_text(x['release_id']):<{w}}  "
                         f"{display_text(x['status']):<11}  "
                         f"{display_text(x['started'])[:19]:<19}  "
                         f"{fmt(x['epsilon']):>10}  {fmt(x['delta']):>10}"
                         f"{_release_note(x)}")
    return lines


def _release_note(x: dict) -> str:
    if x["reason"] and x["status"] in ("failed", "withdrawn"):
        return f"  ({display_text(x['reason'])})"
    lease = x["lease"]
    if lease is not None:
        state = "live" if lease["live"] else "expired"
        return f"  (lease {state}: {display_text(lease['owner'])} until {lease['until']})"
    return ""
