"""Decoding one token against the context length: cached causal TSSA, cached causal MSSA, a GPT-2 cache,
and no cache at all.

    .venv/bin/python benchmarks/decoding.py [--quick] [--device auto|cpu|cuda] [--out [PATH]]

Three language models of one size are built from the specs (``specs/tost-lm.yaml``,
``specs/causal-crate.yaml``, ``specs/gpt2.yaml``) with d = 384, 6 heads, 4 layers, a byte
vocabulary and a context of 4096 tokens, float32, eval mode. At each context length L (128 ... 4096)
the decoder is first fed L - 1 tokens (the prompt), then the time to decode *one more token* is
measured: each model's :class:`crate_compose.CachedModel` holds its states (TSSA: running sums;
MSSA: one cache of ``U^T z``; GPT-2: keys and values), and the same model without a cache
recomputes all L tokens (``model(ids)``), the reference. Rounds are interleaved across the models
(so their ratios are taken in one run); each round decodes one token per model, the table gives
the median over rounds (``--rounds``, default 15; 5 for the recompute at L >= 2048). On a shared
CPU a round in which some task waited for a core more than ``--stall-max`` of the time (Linux PSI,
``/proc/pressure/cpu``) is set aside and retaken.

Memory is the bytes each decoder's state holds after L tokens (:attr:`CachedModel.nbytes`: the caches'
storage, which grows by doubling, and the running sums). The goal checked: cached TSSA's time per
token at 4096 is at most 1.2x its time at 128.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from machine import cpu_stall_us  # benchmarks/machine.py, beside this script

import crate_compose as cc

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODELS = {"tssa (cached)": "tost-lm", "mssa (cached)": "causal-crate", "gpt-2 (cached)": "gpt2"}
SIZES = ["sizes.d=384", "sizes.heads=6", "sizes.depth=4", "sizes.vocab=256", "sizes.context=4096"]
FULL_LENGTHS = (128, 256, 512, 1024, 2048, 4096)
QUICK_LENGTHS = (128, 1024, 4096)
GROWTH_MAX = 1.2


def timed(fn, device: str, stall_max: float, patience: float) -> float:
    """Seconds of one call of ``fn``; retaken while the machine is contended (PSI), up to ``patience`` s."""
    deadline = time.monotonic() + patience
    while True:
        stall = cpu_stall_us()
        if device == "cuda":
            torch.cuda.synchronize()
        began = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - began
        waited = (cpu_stall_us() - stall) / 1e6 if stall is not None else 0.0
        if waited <= stall_max * seconds or time.monotonic() > deadline:
            return seconds
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"lengths {QUICK_LENGTHS}, 5 rounds")
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--stall-max", type=float, default=0.05, help="largest CPU stall share of a kept timing")
    parser.add_argument("--patience", type=float, default=5.0, help="seconds to wait for a quiet machine per timing")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--out", nargs="?", const=str(HERE / "RESULTS.md"), help="append the results as a section")
    args = parser.parse_args(argv)
    device = (
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    lengths = QUICK_LENGTHS if args.quick else FULL_LENGTHS
    rounds = 5 if args.quick else args.rounds
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)

    models = {
        label: cc.build(ROOT / "specs" / f"{spec}.yaml", overrides=SIZES, device=device).eval()
        for label, spec in MODELS.items()
    }
    params = {
        label: cc.summarize(cc.build(ROOT / "specs" / f"{spec}.yaml", overrides=SIZES, meta=True)).params_total
        for label, spec in MODELS.items()
    }
    ids = torch.randint(0, 256, (1, max(lengths) + rounds + 1), generator=torch.Generator().manual_seed(0)).to(device)
    rows = []
    for length in lengths:
        decoders = {}
        for label, model in models.items():
            decoders[label] = cc.CachedModel(model)
            decoders[label](ids[:, : length - 1])  # the prompt: L - 1 tokens
        times: dict[str, list[float]] = {label: [] for label in [*models, "no cache"]}
        recompute_rounds = 5 if length >= 2048 else rounds
        for r in range(rounds):
            for label, decoder in decoders.items():
                token = ids[:, length - 1 + r : length + r]
                if decoder.length + 1 > decoder.context:
                    continue
                times[label].append(
                    timed(lambda decoder=decoder, token=token: decoder(token), device, args.stall_max, args.patience)
                )
            if r < recompute_rounds:  # the reference: GPT-2 recomputing all L tokens for one more logit
                model = models["gpt-2 (cached)"]
                times["no cache"].append(
                    timed(
                        lambda model=model, length=length: model(ids[:, :length]), device, args.stall_max, args.patience
                    )
                )
        memory = {label: decoder.nbytes for label, decoder in decoders.items()}
        rows.append((length, {k: statistics.median(v) for k, v in times.items() if v}, memory))
        cells = ", ".join(f"{k} {statistics.median(v) * 1e3:.2f} ms" for k, v in times.items() if v)
        print(f"L={length}: {cells}", file=sys.stderr, flush=True)

    text = report(rows, params, device, lengths)
    print(text)
    if args.out:
        path = Path(args.out)
        with open(path, "a") as handle:
            handle.write("\n" + text)
        print(f"appended to {path}", file=sys.stderr)
    return 0


def report(rows, params, device: str, lengths) -> str:
    labels = [*MODELS, "no cache"]
    machine = (
        torch.cuda.get_device_name()
        if device == "cuda"
        else f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    )
    lines = [
        f"## decoding.py: one more token against the context length ({device})",
        "",
        f"{datetime.date.today()}, torch {torch.__version__}, {machine}. Models: d = 384, 6 heads, 4 layers, byte "
        "vocabulary, context 4096, float32; parameters: "
        + ", ".join(f"{label.split(' ')[0]} {count:,}" for label, count in params.items())
        + ". Time to decode one token after L - 1 (median over rounds, ms); 'no cache' is GPT-2 recomputing all L "
        "tokens. Memory: bytes each decoder's state holds after L tokens.",
        "",
        "| L | "
        + " | ".join(f"{label} ms" for label in labels)
        + " | "
        + " | ".join(f"{label.split(' ')[0]} state" for label in MODELS)
        + " |",
        "|" + " ---: |" * (1 + len(labels) + len(MODELS)),
    ]
    for length, times, memory in rows:
        cells = [f"{times[label] * 1e3:.2f}" if label in times else "" for label in labels]
        cells += [_bytes(memory[label]) for label in MODELS]
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    first, last = rows[0][1], rows[-1][1]
    growth = {label: last[label] / first[label] for label in labels if label in first and label in last}
    lines += [
        "",
        f"Growth from L = {lengths[0]} to {lengths[-1]}: "
        + ", ".join(f"{label} {value:.2f}x" for label, value in growth.items())
        + ".",
        f"Goal: cached TSSA grows at most {GROWTH_MAX}x: "
        + ("met" if growth["tssa (cached)"] <= GROWTH_MAX else "NOT met")
        + f" ({growth['tssa (cached)']:.2f}x).",
        f"Cache memory at L = {lengths[-1]}: MSSA / GPT-2 = "
        f"{rows[-1][2]['mssa (cached)'] / rows[-1][2]['gpt-2 (cached)']:.2f} (one cache against keys and values); "
        f"TSSA's state is {_bytes(rows[-1][2]['tssa (cached)'])} at every length.",
        "",
    ]
    return "\n".join(lines)


def _bytes(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


if __name__ == "__main__":
    sys.exit(main())
