"""`python -m bench table`: bench/RESULTS.md, the latest result of each scenario.

Every committed result file is read as plain JSON (files of every harness and age: a field a
file lacks is shown as "not recorded"). Per scenario the newest file (by its date, then the
time it started, then its name) gives the headline figures; the scenario's other files are
listed beneath it as reference points. The page depends on the files alone: no clock, no
host facts of its own, everything sorted, so running it twice on one tree writes the same
bytes, and a test holds the committed page to what the committed files give.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from bench.report import RESULTS, host_kind

PAGE = RESULTS.parent / "RESULTS.md"
NOT_RECORDED = "not recorded"
ORDER = ("throughput", "overhead", "streaming", "soak", "keyed-cost", "pooled-throughput-keys",
         "auth", "usage", "routing", "index", "kv_index", "control")
"""The page's order: the load scenarios first, then the in-process ones; others after, sorted."""
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
# Throughput figures worth a line: the ratios between gateways and the CPU per request; the
# kernel's per-thread counts and the paired/interval spreads stay in the file.
_THROUGHPUT = re.compile(
    r"_over_[a-z_]+_rps_(c\d+|paired_median_c\d+|ci95_(lo|hi)_c\d+)$|_minus_|_usage_exact$"
    r"|_cp_cpu_us$|_gateway_cpu_us_c\d+$|_busiest_thread_us_c\d+$|^machine_steal_cores_max"
)


@dataclass(frozen=True)
class Entry:
    """One result file, as the page shows it."""

    name: str
    scenario: str
    date: str
    started: str
    commit: str
    command: str
    host: str
    doc: dict[str, Any]

    @property
    def order(self) -> tuple[str, str, str]:
        return (self.date, self.started, self.name)


def shown_command(command: str, name: str, folder: Path) -> str:
    """The command as it ran, but for result files since renamed or removed from the tree
    (git log has them): `--out` names this file as it is called now, and inputs that are
    not in `folder` under the name the command gave are counted, not listed."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return command
    if not any("bench/results/" in arg for arg in argv):
        return command
    out: list[str] = []
    gone = 0
    for i, arg in enumerate(argv):
        inside = "bench/results/" in arg and not (folder / Path(arg).name).exists()
        if inside and i > 0 and argv[i - 1] == "--out":
            out.append(f"bench/results/{name}")
            continue
        if inside:
            gone += 1
            continue
        if gone:
            out.append(f"[{gone} result files, since renamed or removed]")
            gone = 0
        out.append(arg)
    if gone:
        out.append(f"[{gone} result files, since renamed or removed]")
    return " ".join(a if a.startswith("[") else shlex.quote(a) for a in out)


def read(path: Path) -> Entry:
    """A result file's scenario, date, commit, command and host, whatever harness wrote it."""
    doc: dict[str, Any] = msgspec.json.decode(path.read_bytes())
    scenario = str(doc.get("scenario") or doc.get("kind") or doc.get("bench") or path.stem)
    found = _DATE.search(path.name)
    date = str(doc.get("date") or (found.group(0) if found else NOT_RECORDED))
    return Entry(
        name=path.name,
        scenario=scenario,
        date=date,
        started=str(doc.get("started_at") or doc.get("made_at") or ""),
        commit=_commit(doc),
        command=shown_command(str(doc["command"]), path.name, path.parent)
        if doc.get("command") else NOT_RECORDED,
        host=host_of(doc),
        doc=doc,
    )


def _commit(doc: dict[str, Any]) -> str:
    versions = doc.get("versions")
    if isinstance(versions, dict) and versions.get("llmgw_git"):
        return str(versions["llmgw_git"])
    code = doc.get("code")  # a pooled file: the commit of each run it pooled
    if isinstance(code, list) and code:
        return ", ".join(sorted({str(c) for c in code}))
    return NOT_RECORDED


def host_of(doc: dict[str, Any]) -> str:
    """"amd (AMD EPYC, 2 CPUs, tsc)": the host kind first, then what the file says of it."""
    machine = doc.get("machine")
    if isinstance(machine, dict):
        model = str(machine.get("cpu_model") or "")
        facts = [model] if model else []
        if machine.get("nproc"):
            facts.append(f"{machine['nproc']} CPUs")
        if machine.get("clocksource"):
            facts.append(str(machine["clocksource"]))
        if machine.get("preload"):
            facts.append(f"LD_PRELOAD={Path(str(machine['preload'])).name}")
        kind = host_kind(model) or NOT_RECORDED
        return f"{kind} ({', '.join(facts)})" if facts else kind
    machines = doc.get("machines")  # a pooled file: each run's CPU model
    if isinstance(machines, list) and machines:
        kinds = sorted({host_kind(str(m)) or NOT_RECORDED for m in machines})
        models = sorted({str(m) for m in machines})
        return f"{', '.join(kinds)} ({len(machines)} runs: {', '.join(models)})"
    if isinstance(machine, str) and host_kind(machine) in ("amd", "intel"):
        return f"{host_kind(machine)} ({machine})"
    if isinstance(machine, str) and machine:
        return f"{NOT_RECORDED} (architecture {machine})"
    return NOT_RECORDED


def collect(folder: Path) -> dict[str, list[Entry]]:
    """Every result file in `folder` by scenario, newest first."""
    out: dict[str, list[Entry]] = {}
    for path in sorted(folder.glob("*.json")):
        entry = read(path)
        out.setdefault(entry.scenario, []).append(entry)
    for entries in out.values():
        entries.sort(key=lambda e: e.order, reverse=True)
    return out


def _natural(name: str) -> tuple[tuple[int, str, int], ...]:
    """Sorts `..._c32` before `..._c256`: digits compare as numbers."""
    return tuple((0, part, 0) if not part.isdigit() else (1, "", int(part))
                 for part in re.split(r"(\d+)", name))


def _scenario_order(names: list[str]) -> list[str]:
    known = [n for n in ORDER if n in names]
    return known + sorted(n for n in names if n not in ORDER)


def num(x: Any) -> str:
    """A figure as the page prints it: fixed digits by size, so the text never varies."""
    if isinstance(x, bool):
        return "yes" if x else "no"
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if abs(x) >= 100:
            return f"{x:,.0f}"
        if abs(x) >= 1:
            return f"{x:.2f}"
        return f"{x:.3f}"
    return str(x).replace("|", "/").replace("\n", " ")


def _facts(e: Entry) -> list[str]:
    settings = e.doc.get("settings")
    quick = isinstance(settings, dict) and bool(settings.get("quick"))
    lines = [
        f"- file: `bench/results/{e.name}`"
        + (" (`--quick`: a smoke run, not a result)" if quick else ""),
        f"- date: {e.date}",
        f"- host: {e.host}",
        f"- commit: {e.commit}",
        f"- command: `{e.command}`" if e.command != NOT_RECORDED else f"- command: {NOT_RECORDED}",
    ]
    if e.doc.get("void"):
        lines.append(f"- void: {num(e.doc.get('void_reason'))}")
    if e.doc.get("verdict"):
        lines.append(f"- verdict: {num(e.doc['verdict'])}")
    return lines


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(r) + " |" for r in rows)]


def _median(cell: Any) -> Any:
    return cell.get("median") if isinstance(cell, dict) else cell


def headline(e: Entry) -> list[str]:
    """The figures a reader wants first, as Markdown lines."""
    doc = e.doc
    out: list[str] = []
    summary = doc.get("summary")
    rows: list[list[str]]
    if isinstance(summary, list) and summary and isinstance(summary[0], dict) \
            and "rps" in summary[0]:
        stream = any(_median(r.get("ttft_p50_ms")) for r in summary)
        head = ["target", "c", "req/s", "p50 ms", "p99 ms", "gateway CPU (cores)", "RSS MB"]
        head += ["TTFT p50 ms", "chunk gap ms"] if stream else []
        rows = []
        for r in sorted(summary, key=lambda r: (int(r.get("concurrency", 0)), str(r["target"]))):
            row = [str(r.get("target")), str(r.get("concurrency")), num(_median(r.get("rps"))),
                   num(_median(r.get("p50_ms"))), num(_median(r.get("p99_ms"))),
                   num(_median(r.get("server_cpu"))), num(r.get("rss_mb_max"))]
            if stream:
                row += [num(_median(r.get("ttft_p50_ms"))), num(_median(r.get("gap_mean_ms")))]
            rows.append(row)
        out += ["Medians over rounds:", "", *_table(head, rows), ""]
    checks = doc.get("checks")
    if isinstance(checks, list) and checks:
        rows = [[str(c.get("name")), num(c.get("value")), f"{c.get('op')} {num(c.get('target'))}",
                 "met" if c.get("met") else "missed"] for c in checks if isinstance(c, dict)]
        out += [*_table(["check", "value", "target", ""], rows), ""]
    levels = doc.get("levels")
    if isinstance(levels, list) and levels:
        rows = []
        for lv in sorted(levels, key=lambda lv: int(lv.get("concurrency", 0))):
            ci = lv.get("ci95") or [None, None]
            rows.append([str(lv.get("concurrency")), num(lv.get("plain_rps")),
                         num(lv.get("keyed_rps")), num(lv.get("ratio_of_medians")),
                         f"{num(ci[0])}-{num(ci[1])}",
                         num(lv.get("paired_median")), str(lv.get("runs_meeting", "-"))])
        head = ["c", "llmgw req/s", "llmgw-keys req/s", "ratio of medians", "95% interval",
                "paired median", "runs >= target"]
        out += [f"{len(doc.get('files') or [])} runs pooled ({num(doc.get('code_note'))}):", "",
                *_table(head, rows), ""]
    figures = doc.get("figures")
    if not isinstance(figures, dict):  # older harnesses: the file's own scalar fields
        skip = {"scenario", "kind", "bench", "date", "made_at", "command", "python", "machine"}
        figures = {k: v for k, v in doc.items()
                   if k not in skip and isinstance(v, int | float) and not isinstance(v, bool)}
    if e.scenario == "throughput":
        figures = {k: v for k, v in figures.items() if _THROUGHPUT.search(k)}
    if figures and not checks:  # where there are checks, they hold the figures that count
        rows = [[f"`{k}`", num(figures[k])] for k in sorted(figures, key=_natural)]
        out += [*_table(["figure", "value"], rows), ""]
    return out


def render(folder: Path) -> str:
    """bench/RESULTS.md for the result files in `folder`."""
    by = collect(folder)
    lines = [
        "# Benchmark results",
        "",
        "Written by `python -m bench table` from the files in `bench/results/`: edit those, not",
        "this page. For each scenario, its newest result in full, then its other kept files.",
        "[bench/README.md](README.md) says what each scenario measures and how to run it;",
        "[docs/benchmarks.md](../docs/benchmarks.md) how each figure is measured. Compare figures",
        "as ratios within one file, and absolute figures only between hosts of one kind.",
        "",
    ]
    names = _scenario_order(sorted(by))
    rows = [[f"[{n}](#{n.replace('_', '')})", by[n][0].date, by[n][0].host.split(" (")[0],
             by[n][0].commit, f"`{by[n][0].name}`"] for n in names]
    lines += [*_table(["scenario", "latest", "host", "commit", "file"], rows), ""]
    for n in names:
        latest, *rest = by[n]
        lines += [f"## {n}", "", *_facts(latest), "", *headline(latest)]
        if rest:
            lines += ["Other kept results, newest first:", ""]
            lines += _table(["file", "date", "host", "commit", "command"],
                            [[f"`{e.name}`", e.date, e.host, e.commit,
                              f"`{e.command}`" if e.command != NOT_RECORDED else NOT_RECORDED]
                             for e in rest])
            lines.append("")
    others = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                    if p.is_file() and p.suffix != ".json")
    if others:
        lines += ["## Other records", "", "Kept beside the results, not read by this table:", ""]
        lines += [f"- `bench/results/{o}`" for o in others]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def write(folder: Path = RESULTS, page: Path = PAGE) -> bool:
    """Writes the page; True when its bytes changed."""
    text = render(folder).encode()
    old = page.read_bytes() if page.exists() else b""
    if text != old:
        page.write_bytes(text)
    return text != old
