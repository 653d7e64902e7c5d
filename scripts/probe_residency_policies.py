"""The slot banks' eviction policy on the bench model's own routing: copies a decode token and VRAM hits.

    .venv/bin/python scripts/probe_residency_policies.py [--slots 209 ...] [--tree DIR]

Records once (in /tmp/sluice-residency) the routing of `sluice bench`'s olmoe-1b-7b random model (int8) on
the CPU device: a 512-token prompt and 128 sampled tokens, then a 64-token prompt and 128 more (every layer
call's routed experts and the next layer's guesses). Then replays the decode steps through SlotBanks as
Experts drives them in decode: the layer's experts found or brought in (protected), their uses noted, the
better half of the next layer's guesses copied ahead. A prompt brings in its experts, most used first, as a
sweep. The first 16 decode tokens warm the banks and are not counted. --tree: import SlotBanks from another
checkout (the A/B of a policy change). Also prints plain LRU, and Belady's optimum (the block next used last
goes, knowing the future) as the bound.
--ram N: the decode through both tiers, N RAM-cache blocks beside the slots, as in the exceeds regime (exclusive:
a block copied into a slot is demoted in RAM, a slot's victim goes back to RAM; the better half of the next
layer's guesses copied ahead from RAM or read ahead from disk): blocks read from disk a decode token, with
RamCache as it is, its victim from the 32 least recently used (the rule before) and plain LRU.
"""
from __future__ import annotations

import argparse
import bisect
import json
import random
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = Path("/tmp/sluice-residency")
WARM_TOKENS = 16


def record() -> list:
    import engine
    from engine import GenerationParams
    from engine.runtime import experts as experts_module
    from engine.tools.presets import write_sluice_dir
    model = write_sluice_dir("olmoe-1b-7b", WORK / "olmoe-1b-7b-int8", "int8", device="cpu", progress=print)
    steps, real = [], experts_module.Experts.run

    def run(self, layer, x, weights, ids, out, next_layer=None, **kw):
        t, k = weights.shape
        flat = ids.tolist()
        steps.append([layer, t, flat[:t * k], flat[t * k:], next_layer])
        return real(self, layer, x, weights, ids, out, next_layer=next_layer, **kw)

    experts_module.Experts.run = run
    eng = engine.load(model, device="cpu", dense_quant="int8", max_context=1024)
    rng = random.Random(0)
    try:
        for prompt_tokens, new_tokens in ((512, 128), (64, 128)):
            prompt = [rng.randrange(eng.spec.vocab_size) for _ in range(prompt_tokens)]
            for _ in eng.generate(prompt, GenerationParams(max_new_tokens=new_tokens, temperature=1.0, seed=0,
                                                           ignore_eos=True)):
                pass
    finally:
        experts_module.Experts.run = real
        eng.close()
    return steps


class Belady:
    """The bound: banks (layer % 2, as SlotBanks) that evict the unprotected block next routed to last (they know
    the trace)."""
    def __init__(self, slots: int, next_uses: dict):
        self.slots, self.next_uses, self.resident, self.now = slots, next_uses, [set(), set()], 0

    def find(self, key):
        return 0 if key in self.resident[key[0] % 2] else None

    def acquire(self, key, protected):
        resident = self.resident[key[0] % 2]
        if len(resident) >= self.slots:
            def next_use(k):
                uses = self.next_uses.get(k, [])
                i = bisect.bisect_right(uses, self.now)
                return uses[i] if i < len(uses) else float("inf")
            resident.remove(max((k for k in resident if k not in protected), key=next_use))
        resident.add(key)
        return 0

    def note_used(self, layer, routed):
        pass

    def begin_sweep(self):
        pass

    def end_sweep(self):
        return []


def replay_prompt(banks, layer: int, routed: list, bring_in) -> list:
    """A prompt's layer: a sweep, its experts brought in most used first; -> the blocks the sweep left resident."""
    protected = {(layer, e) for e in routed}
    banks.begin_sweep()
    banks.note_used(layer, routed)
    for expert, _ in Counter(routed).most_common():
        if banks.find((layer, expert)) is None:
            bring_in((layer, expert), protected)
    return banks.end_sweep()


def replay(steps: list, make_banks, layers: int) -> tuple[float, float]:
    """-> (blocks copied a decode token, VRAM hit rate of the routed experts)."""
    banks = make_banks()
    copies = hits = wanted_total = decoded = 0
    for index, (layer, num_tokens, routed, guesses, next_layer) in enumerate(steps):
        if isinstance(banks, Belady):
            banks.now = index
        wanted = list(dict.fromkeys(routed))
        protected = {(layer, e) for e in wanted}
        if num_tokens > 1:
            replay_prompt(banks, layer, routed, banks.acquire)
            continue
        counting = decoded >= WARM_TOKENS * layers
        decoded += 1
        for expert in wanted:
            if banks.find((layer, expert)) is not None:
                hits += counting
            else:
                banks.acquire((layer, expert), protected)
                copies += counting
        wanted_total += len(wanted) * counting
        banks.note_used(layer, routed)
        predicted = list(dict.fromkeys(guesses))
        if next_layer is not None and predicted:                   # Experts._prefetch: the better half
            guarded = {(next_layer, e) for e in predicted}
            for expert in predicted[:max(1, len(predicted) // 2)]:
                if banks.find((next_layer, expert)) is None:
                    banks.acquire((next_layer, expert), guarded)
                    copies += counting
    tokens = max(1, decoded / layers - WARM_TOKENS)
    return copies / tokens, hits / max(1, wanted_total)


class Tiers:
    """SlotBanks and RamCache as Experts drives them in decode (exclusive tiers), counting disk reads."""
    def __init__(self, slots: int, ram_blocks: int, window: int | None):
        import torch
        from engine.runtime.cache import RamCache
        from engine.runtime.slots import SlotBanks
        from engine.runtime.telemetry import Telemetry
        self.banks = SlotBanks(slots, 1, torch.device("cpu"), Telemetry())
        self.cache = RamCache(ram_blocks, 1, Telemetry(), allocate=lambda n: torch.empty(n, dtype=torch.uint8))
        self.cache.uses = self.banks.rank if window != 0 else None        # 0: plain LRU
        if window:
            self.cache.window = window
        self.reads = 0

    def to_slot(self, key, protected, ram_hit: bool) -> None:
        """Experts._copy: the slot's victim back to RAM, the copied block demoted there."""
        self.banks.acquire(key, protected)
        evicted, sweeping = self.banks.last_evicted, self.banks.sweeping
        if evicted and not (sweeping and self.banks.last_evicted_swept):
            if evicted[0] in self.cache:
                self.cache.touch(evicted[0])
            elif self.cache.can_insert():
                self.cache.insert(evicted[0])
        if not (sweeping and ram_hit):
            self.cache.demote(key)

    def bring_in(self, key, protected) -> None:
        ram_hit = self.cache.lookup(key) is not None
        if not ram_hit:
            self.reads += 1
            self.cache.insert(key)
        self.to_slot(key, protected, ram_hit)


def replay_tiers(steps: list, tiers: Tiers, layers: int, reads_ahead: int | None = None) -> float:
    """-> blocks read from disk a decode token. reads_ahead: of the next layer's guesses, how many that neither
    tier holds are read ahead (default the better half, as Experts does; SLUICE_PREFETCH_READS on the GPU)."""
    decoded = counted = 0
    banks, cache = tiers.banks, tiers.cache
    for layer, num_tokens, routed, guesses, next_layer in steps:
        wanted = list(dict.fromkeys(routed))
        protected = {(layer, e) for e in wanted}
        if num_tokens > 1:
            for key in replay_prompt(banks, layer, routed, tiers.bring_in):
                cache.demote(key)
            continue
        counting, before = decoded >= WARM_TOKENS * layers, tiers.reads
        decoded += 1
        banks.note_used(layer, routed)
        for expert in wanted:
            if banks.find((layer, expert)) is None:
                tiers.bring_in((layer, expert), protected)
        predicted = list(dict.fromkeys(guesses))
        if next_layer is not None and predicted:                   # Experts._prefetch: the better half
            guarded = {(next_layer, e) for e in predicted}
            better = [(next_layer, e) for e in predicted[:max(1, len(predicted) // 2)]]
            for key in better:
                if banks.find(key) is None and key in cache:
                    cache.lookup(key)
                    tiers.to_slot(key, guarded, ram_hit=True)
            for key in better if reads_ahead is None else [(next_layer, e) for e in predicted[:reads_ahead]]:
                if banks.find(key) is None and key not in cache and cache.can_insert():
                    tiers.reads += 1
                    cache.insert(key)
        counted += (tiers.reads - before) * counting
    return counted / max(1, decoded / layers - WARM_TOKENS)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slots", type=int, nargs="+", default=[209])
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--trace", type=Path, default=WORK / "trace.json", help="a trace recorded elsewhere")
    parser.add_argument("--ram", type=int, help="RAM-cache blocks beside the slots: disk reads through both tiers")
    parser.add_argument("--reads-ahead", type=int, nargs="*", default=[],
                        help="with --ram: also replay reading ahead this many of the next layer's guesses")
    args = parser.parse_args()
    sys.path.insert(0, str(args.tree.resolve()))
    trace = args.trace
    if not trace.is_file():
        WORK.mkdir(parents=True, exist_ok=True)
        trace.write_text(json.dumps(record()))
    steps = [s for s in json.loads(trace.read_text()) if s[0] != "end"]
    import torch
    from engine.runtime.slots import SlotBanks
    from engine.runtime.telemetry import Telemetry
    layers = len({s[0] for s in steps})
    next_uses: dict = {}
    for index, (layer, _, routed, _, _) in enumerate(steps):
        for expert in set(routed):
            next_uses.setdefault((layer, expert), []).append(index)
    print(f"SlotBanks from {args.tree.resolve()}; {sum(s[1] == 1 for s in steps) // layers} decode tokens, "
          f"the first {WARM_TOKENS} not counted")
    for slots in args.slots:
        if args.ram:
            for name, window in (("RamCache", None), ("32 oldest (before)", 32), ("plain LRU", 0)):
                read = replay_tiers(steps, Tiers(slots, args.ram, window), layers)
                print(f"{slots} slots a bank, {args.ram} RAM blocks  {name:18s} {read:5.1f} blocks read from disk a token")
            for ahead in args.reads_ahead:
                read = replay_tiers(steps, Tiers(slots, args.ram, None), layers, ahead)
                print(f"{slots} slots a bank, {args.ram} RAM blocks  {ahead} guesses read ahead {read:5.1f} blocks read from disk a token")
            continue

        def banks(lru=False):
            made = SlotBanks(slots, 1, torch.device("cpu"), Telemetry())
            if lru:
                made.lru = True
                made.window = 1            # (the policy before: window 1 was its LRU)
            return made
        for name, make in (("SlotBanks", banks), ("plain LRU", lambda: banks(lru=True)),
                           ("Belady (bound)", lambda: Belady(slots, next_uses))):
            copied, hit = replay(steps, make, layers)
            print(f"{slots} slots a bank  {name:15s} {copied:5.1f} blocks copied a decode token, VRAM hits {hit:.1%}")


if __name__ == "__main__":
    main()
