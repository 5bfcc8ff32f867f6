"""Sandbox start overhead (`true` through each layer that works here vs a plain subprocess) and floor check time."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import django

django.setup()

from django.conf import settings  # noqa: E402

from bench.report import median, micros, millis, percentile, table, target  # noqa: E402
from tools_app.command_policy import CommandPolicy  # noqa: E402
from tools_app.sandbox import ExecRequest, WorkspaceSandbox, sandbox_probe  # noqa: E402

ROUNDS = 6
RUNS_PER_ROUND = 25
FLOOR_ROUNDS = 200
CORPUS = Path(settings.BASE_DIR).parent / "shared" / "vectors" / "commands.tsv"
TRUE = shutil.which("true") or "/bin/true"


def plain() -> None:
    subprocess.run([TRUE], stdin=subprocess.DEVNULL, capture_output=True, check=True)


def through(sandbox: WorkspaceSandbox):
    workspace = sandbox.workspace(agent_id=1, agent_name="bench")

    def once() -> None:
        captured = sandbox.engine.run(workspace=workspace, cwd=workspace.path, argv=[TRUE], timeout_s=30)
        assert captured.exit_code == 0, captured

    return once


def full_exec(sandbox: WorkspaceSandbox):
    request = ExecRequest(agent_id=1, agent_name="bench", language="bash", source="true")

    def once() -> None:
        assert sandbox.run_blocking(request).exit_code == 0

    return once


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure_starts(variants: dict) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Every variant in every round, a block of starts each, so machine noise falls on all of them alike.

    Blocks rather than single starts in turn: the Landlock layer forks this process, and the copy-on-write
    faults that leaves behind would otherwise be billed to whichever variant runs next. Wall time per start,
    and the CPU the started processes (setpriv, prlimit, bwrap, ...) used per start, which other load on the
    machine barely moves.
    """
    samples: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, float] = dict.fromkeys(variants, 0.0)
    for _ in range(ROUNDS):
        for name, function in variants.items():
            function()
            cpu_before = children_cpu()
            for _ in range(RUNS_PER_ROUND):
                started = time.perf_counter()
                function()
                samples[name].append(time.perf_counter() - started)
            cpu[name] += children_cpu() - cpu_before
    return samples, {name: total / (ROUNDS * RUNS_PER_ROUND) for name, total in cpu.items()}


def corpus() -> list[str]:
    lines = [line for line in CORPUS.read_text().splitlines() if line and not line.startswith("#")]
    return [line.split("\t", 1)[1] for line in lines]


def measure_floor(commands: list[str]) -> tuple[list[float], list[float]]:
    policy = CommandPolicy()
    per_command, per_pass = [], []
    for _ in range(FLOOR_ROUNDS):
        pass_started = time.perf_counter()
        for command in commands:
            started = time.perf_counter()
            policy.evaluate(language="bash", text=command)
            per_command.append(time.perf_counter() - started)
        per_pass.append(time.perf_counter() - pass_started)
    return per_command, per_pass


def main() -> int:
    data_dir = Path(settings.DATA_DIR) / "bench-sandbox"
    data_dir.mkdir(parents=True, exist_ok=True)
    report = sandbox_probe(data_dir=data_dir)
    sandboxes = {
        level: WorkspaceSandbox(data_dir=data_dir, policy=CommandPolicy(), report=report, level=level)
        for level in report.available
    }
    variants = {"plain subprocess": plain}
    variants.update({level: through(sandbox) for level, sandbox in sandboxes.items()})
    if sandboxes:
        variants[f"bash_exec path at {report.level}"] = full_exec(sandboxes[report.level])
    samples, cpu = measure_starts(variants)
    base = median(samples["plain subprocess"])

    print("## Sandbox start overhead and floor check time\n")
    print(
        f"`{TRUE}` started {ROUNDS * RUNS_PER_ROUND} times per variant ({ROUNDS} rounds, a block of "
        f"{RUNS_PER_ROUND} after one untimed start), from this process, output captured; a layer runs it as the "
        "agent's uid with its rlimits, and the layers without a pid namespace also sweep the uid afterwards. "
        f"Load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs. "
        "The last row is the whole `bash_exec` path (floor check, "
        "workspace, `bash -c true`). Probe: "
        + ", ".join(f"{c.level} {'works' if c.ok else 'fails: ' + c.reason}" for c in report.checks)
        + ".\n"
    )
    rows = []
    for name, values in samples.items():
        overhead = median(values) - base
        rows.append(
            [
                name,
                millis(median(values)),
                millis(min(values)),
                millis(percentile(values, 0.9)),
                "—" if name == "plain subprocess" else f"{overhead * 1e3:+.1f} ms",
                millis(cpu[name]),
            ]
        )
    print(table(["variant", "median", "min", "p90", "over plain (median)", "child CPU per start"], rows))

    commands = corpus()
    per_command, per_pass = measure_floor(commands)
    print()
    print(
        table(
            ["floor check", "median", "p99", "whole corpus (median pass)"],
            [
                [
                    f"{len(commands)} corpus commands × {FLOOR_ROUNDS}",
                    micros(median(per_command)),
                    micros(percentile(per_command, 0.99)),
                    millis(median(per_pass)),
                ]
            ],
        )
    )
    print()
    if report.level in sandboxes:
        overhead = median(samples[report.level]) - base
        print(
            target(
                overhead <= 0.015,
                f"start overhead at the strongest layer ({report.level}) ≤ 15 ms over plain: {overhead * 1e3:+.1f} ms",
            )
        )
    else:
        print(target(False, f"no sandbox layer works here: {'; '.join(report.reasons)}"))
    print(target(median(per_pass) <= 0.05, f"floor check of the whole corpus ≤ 50 ms: {millis(median(per_pass))}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
