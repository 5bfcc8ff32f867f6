"""Policy decision time over three scopes: the compiled ScopeTable against a naive fnmatch loop, same entries."""

from __future__ import annotations

import gc
import random
import sys
import time
from fnmatch import fnmatchcase

from bench.report import median, micros, percentile, table, target
from tools_app.chokepoint.base import READ_ONLY
from tools_app.chokepoint.policy import (
    RANK,
    WILDCARDS,
    AgentInfo,
    ChannelInfo,
    CompiledPolicy,
    ScopeTable,
    decide,
)

SIZES = (10, 100, 1_000, 10_000)
AGENT_ID, CHANNEL_ID = 7, 3
AGENT = AgentInfo(AGENT_ID, "builder", None, None, True)
CHANNEL = ChannelInfo(CHANNEL_ID, "ops", "web", False, None, None, 120)
LOOKUPS_PER_KIND = 200
ROUNDS = 5
CHUNK = 50
LOOSE_GLOBS = (("*admin*", "deny"), ("*secret*", "ask"), ("*[Pp]assword*", "ask"))
ACTIONS = ("allow", "ask", "deny")
ACTION_WEIGHTS = (60, 25, 15)
KINDS = ("exact", "glob", "miss")

Entries = list[tuple[str, str]]


def scope_entries(rng: random.Random, count: int, namespaces: int, taken: set[str]) -> Entries:
    """One scope's entries: mostly exact names, a quarter `nsN__*`, some `*_deleteN`, a few loose globs."""
    loose = 1 if count < 30 else len(LOOSE_GLOBS)
    suffixes = round(count * 0.12)
    prefixes = round(count * 0.25)
    entries: Entries = list(LOOSE_GLOBS[:loose])
    patterns = {pattern for pattern, _ in entries}

    def add(make) -> None:
        while True:
            pattern = make()
            if pattern not in patterns:
                patterns.add(pattern)
                taken.add(pattern)
                entries.append((pattern, rng.choices(ACTIONS, ACTION_WEIGHTS)[0]))
                return

    for _ in range(prefixes):
        add(lambda: f"ns{rng.randrange(namespaces)}__*")
    for _ in range(suffixes):
        add(lambda: f"*_delete{rng.randrange(namespaces)}")
    while len(entries) < count:
        add(lambda: f"ns{rng.randrange(namespaces)}__{rng.choice(('get', 'put', 'list', 'run'))}_{rng.randrange(50)}")
    rng.shuffle(entries)
    return entries


def scenario(size: int, seed: int) -> tuple[dict[str, Entries], dict[str, list[str]]]:
    """Entries for the three scopes (size in total) and the lookups: exact hits, glob hits and misses."""
    rng = random.Random(seed)
    namespaces = max(4, size // 2)
    taken: set[str] = set()
    per_scope = size // 3
    scopes = {
        "channel": scope_entries(rng, per_scope, namespaces, taken),
        "agent": scope_entries(rng, per_scope, namespaces, taken),
    }
    scopes["global"] = scope_entries(rng, size - 2 * per_scope, namespaces, taken)
    exact = sorted({p for entries in scopes.values() for p, _ in entries if not WILDCARDS.search(p)})
    globs = sorted({p for entries in scopes.values() for p, _ in entries if WILDCARDS.search(p)})
    lookups = {
        "exact": [rng.choice(exact) for _ in range(LOOKUPS_PER_KIND)],
        "glob": [glob_hit(rng.choice(globs), rng) for _ in range(LOOKUPS_PER_KIND)],
        "miss": [f"miss{rng.randrange(10**6)}__lookup_{i}" for i in range(LOOKUPS_PER_KIND)],
    }
    return scopes, lookups


def glob_hit(pattern: str, rng: random.Random) -> str:
    """A tool name the glob matches that no exact entry names."""
    word = f"probe{rng.randrange(10**6)}"
    if pattern.startswith("ns"):
        return pattern.replace("*", word)
    if pattern.startswith("*_delete"):
        return word + pattern[1:]
    return {"*admin*": f"{word}_admin_x", "*secret*": f"{word}_secret_y", "*[Pp]assword*": f"{word}_Password"}[pattern]


def compiled_policy(scopes: dict[str, Entries]) -> CompiledPolicy:
    return CompiledPolicy(
        version="bench",
        global_tier="auto",
        global_table=ScopeTable("global:", scopes["global"]),
        agent_tables={AGENT_ID: ScopeTable(f"agent:{AGENT.name}:", scopes["agent"])},
        channel_tables={CHANNEL_ID: ScopeTable(f"channel:{CHANNEL.name}:", scopes["channel"])},
        agents={AGENT_ID: AGENT},
        channels={CHANNEL.name: CHANNEL},
    )


def fast_decision(policy: CompiledPolicy, tool: str):
    entry = policy.entry_for(tool, AGENT_ID, CHANNEL_ID)
    tier, source = policy.tier_for(AGENT_ID, CHANNEL, None)
    return decide(tool=tool, facts=READ_ONLY, entry=entry, tier=tier, tier_source=source), entry


class NaiveRule:
    """What the naive loop found: the winning action and every label the contract allows to name it (ties)."""

    def __init__(self, action: str, labels: list[str], exact: bool):
        self.action = action
        self.labels = labels
        self.label = labels[0]
        self.exact = exact


def naive_scope(entries: Entries, label_prefix: str, tool: str) -> NaiveRule | None:
    """Every entry through fnmatchcase: an exact entry beats globs, else the most restrictive matching glob."""
    best_rank, labels = -1, []
    for pattern, action in entries:
        if not fnmatchcase(tool, pattern):
            continue
        if not WILDCARDS.search(pattern):
            return NaiveRule(action, [label_prefix + pattern], exact=True)
        rank = RANK[action]
        if rank > best_rank:
            best_rank, labels = rank, [label_prefix + pattern]
        elif rank == best_rank:
            labels.append(label_prefix + pattern)
    if not labels:
        return None
    return NaiveRule(next(a for a, r in RANK.items() if r == best_rank), labels, exact=False)


def naive_entry(naive_scopes: list[tuple[Entries, str]], tool: str) -> NaiveRule | None:
    """Across scopes (channel, agent, global) the most restrictive wins; on a tie the most specific scope."""
    best = None
    for entries, label_prefix in naive_scopes:
        rule = naive_scope(entries, label_prefix, tool)
        if rule is not None and (best is None or RANK[rule.action] > RANK[best.action]):
            best = rule
    return best


def naive_decision(policy: CompiledPolicy, naive_scopes: list[tuple[Entries, str]], tool: str):
    entry = naive_entry(naive_scopes, tool)
    tier, source = policy.tier_for(AGENT_ID, CHANNEL, None)
    return decide(tool=tool, facts=READ_ONLY, entry=entry, tier=tier, tier_source=source), entry


def disagreement(policy, naive_scopes, tool: str) -> str | None:
    decision, entry = fast_decision(policy, tool)
    naive, naive_rule = naive_decision(policy, naive_scopes, tool)
    if (entry is None) != (naive_rule is None):
        return f"{tool!r}: compiled entry {entry}, naive entry {naive_rule and naive_rule.labels}"
    if entry is not None and (entry.action != naive_rule.action or entry.label not in naive_rule.labels):
        return f"{tool!r}: compiled {entry.action} {entry.label}, naive {naive_rule.action} {naive_rule.labels}"
    if (decision.verdict, decision.decided_by) != (naive.verdict, naive.decided_by):
        return f"{tool!r}: compiled {decision}, naive {naive}"
    return None


def timed_pass(decision, lookups: list[tuple[str, str]], found: dict[str, list[float]]) -> None:
    clock = time.perf_counter_ns
    for kind, tool in lookups:
        started = clock()
        decision(tool)
        found[kind].append((clock() - started) / 1e9)


def prepare(size: int):
    """The compiled policy, the naive loop and the shuffled lookups of one size, after checking they all agree."""
    scopes, lookups = scenario(size, seed=size)
    policy = compiled_policy(scopes)
    naive_scopes = [
        (scopes["channel"], f"channel:{CHANNEL.name}:"),
        (scopes["agent"], f"agent:{AGENT.name}:"),
        (scopes["global"], "global:"),
    ]
    for kind, names in lookups.items():
        for tool in names:
            problem = disagreement(policy, naive_scopes, tool)
            if problem is not None:
                print(f"DISAGREEMENT at {size} entries ({kind} lookup): {problem}")
                sys.exit(1)
            found = naive_entry(naive_scopes, tool)
            if (kind == "miss") != (found is None):
                print(f"scenario error at {size} entries: {kind} lookup {tool!r} found {found and found.labels}")
                sys.exit(1)
    mixed = [(kind, tool) for kind, names in lookups.items() for tool in names]
    random.Random(size).shuffle(mixed)
    return (
        lambda tool: fast_decision(policy, tool),
        lambda tool: naive_decision(policy, naive_scopes, tool),
        mixed,
    )


def measure() -> dict[int, dict[str, dict[str, list[float]]]]:
    """Rounds go over every size in chunks of lookups: an untimed pass of the compiled policy (the naive loop just
    before pushed its tables out of the CPU caches), a timed one, then the naive loop over the same chunk. Machine
    noise, heavy on this shared box, so hits both implementations and every size alike."""
    prepared = {size: prepare(size) for size in SIZES}
    samples = {size: {impl: {kind: [] for kind in KINDS} for impl in ("fast", "naive")} for size in SIZES}
    scratch: dict[str, list[float]] = {kind: [] for kind in KINDS}
    gc.collect()
    for _ in range(ROUNDS):
        for size, (fast, naive, lookups) in prepared.items():
            # At 10,000 entries the naive loop takes milliseconds a lookup: every fifth lookup is plenty for it.
            stride = max(1, size // 2000)
            for start in range(0, len(lookups), CHUNK):
                chunk = lookups[start : start + CHUNK]
                timed_pass(fast, chunk, scratch)
                timed_pass(fast, chunk, samples[size]["fast"])
                timed_pass(naive, chunk[::stride], samples[size]["naive"])
    return {
        size: {
            "by_kind": found["fast"],
            "fast": [t for kind in KINDS for t in found["fast"][kind]],
            "naive": [t for kind in KINDS for t in found["naive"][kind]],
        }
        for size, found in samples.items()
    }


def main() -> int:
    results = measure()
    rows = []
    for size, r in results.items():
        rows.append(
            [
                f"{size:,}",
                micros(median(r["fast"])),
                micros(percentile(r["fast"], 0.99)),
                *(micros(median(r["by_kind"][kind])) for kind in KINDS),
                micros(median(r["naive"])),
                micros(percentile(r["naive"], 0.99)),
                f"{median(r['naive']) / median(r['fast']):,.0f}×",
            ]
        )
    print("## Policy decision time (three scopes, compiled vs naive fnmatch loop)\n")
    print(
        f"Each size is the total over global, agent and channel scopes (exact names, `nsN__*`, `*_deleteN`, "
        f"`*admin*`-style globs); {3 * LOOKUPS_PER_KIND} lookups (⅓ exact hits, ⅓ glob hits, ⅓ misses), "
        f"{ROUNDS} rounds over every size in chunks of {CHUNK} lookups: an untimed and a timed pass of the compiled "
        "policy, then the naive loop (every fifth lookup at 10,000 entries); "
        "a decision is entry + tier + decide(). Both agree on every lookup.\n"
    )
    print(
        table(
            [
                "entries",
                "median",
                "p99",
                "median exact",
                "median glob",
                "median miss",
                "naive median",
                "naive p99",
                "speed-up",
            ],
            rows,
        )
    )
    at_100, at_1k, at_10k = (median(results[s]["fast"]) for s in (100, 1_000, 10_000))
    speedup = median(results[1_000]["naive"]) / at_1k
    print()
    print(target(at_1k <= 10e-6, f"median at 1,000 entries ≤ 10 µs: {micros(at_1k)}"))
    print(target(at_10k <= 2 * at_100, f"10,000 entries within 2× of 100: {at_10k / at_100:.2f}×"))
    print(target(speedup >= 50, f"≥ 50× faster than the naive loop at 1,000 entries: {speedup:,.0f}×"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
