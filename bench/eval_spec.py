#!/usr/bin/env python3
"""bench/eval_spec.py: the speculative-decoding eval of the default model pair (driven by
bench/eval_spec.sh; standard library only).

For each prompt set (HumanEval: the raw prompt, code completion; MT-Bench: the first turn in
Kimi's chat format, --chat) and each temperature (greedy, and 0.7 with no top-k/top-p/min-p
filter), every prompt runs `ember run --json` four ways, interleaved so machine load hits all
alike: plain (--draft none); speculative as a user gets it (spec: the confidence/cost scheduler,
--verify-width 0, and the default --spec-policy auto, which decodes plainly while drafting does
not pay); the scheduler drafting every pass (always: --spec-policy always); and --verify-width 8
(w8: the whole 7-draft block every pass, --spec-policy always).
What the governor learns is kept between the runs of one eval as `ember run` keeps it between a
user's runs (--spec-memory, a file of the eval's own that starts empty), so later prompts start
where earlier ones left off; --no-spec-memory makes every run start afresh (--spec-memory off).
Reported per set and temperature:
  - tau: tokens committed per target pass, summed over prompts (sum(passes + accepted) /
    sum(passes));
  - per-position acceptance from the summed accept_hist (hist[i]: passes that accepted i
    drafts): position k's rate is S(k) / S(k-1), S(k) = passes that accepted at least k drafts.
    At width 8 every pass verifies 7 drafts (bar passes cut short by the token budget), so this
    is the conditional acceptance of draft k given drafts 1..k-1 were accepted; under the
    scheduler, passes that verified fewer than k drafts also count as rejections (a lower bound);
  - generation tok/s (ember's tok_per_s: tokens after the first over the time after the
    prompt), median over prompts, plain vs speculative, and the ratio of the medians; then two
    steadier ratios: by total time (summed tokens over summed generation time) and the median
    of each prompt's own ratio;
  - plain passes of spec: the passes its governor made without drafting;
  - at greedy: whether every speculative run's tokens equal the plain run's (exit status 1 when
    any differ).
With --expert-cache SIZE every run reads the routed experts from storage (--moe-storage ssd,
O_DIRECT where the file system allows, a cache of SIZE) and a second table gives, per mode, the
bytes read from storage per committed token (sum of experts.gen_bytes_read over prompts / sum
of tokens the passes committed), its ratio to plain decoding's, and the read rate measured
(bytes_read / read_seconds over every run of the mode).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODES = [
    ("plain", ["--draft", "none"]),
    ("spec", []),
    ("always", ["--spec-policy", "always"]),
    ("w8", ["--verify-width", "8", "--spec-policy", "always"]),
]
SPEC_MODES = ("spec", "always", "w8")


def load_prompts(path, limit):
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r["prompt"] for r in rows[:limit]]


def run_one(args, prompt_file, chat, temp, seed, extra):
    cmd = [args.ember, "run", "-f", prompt_file, "-n", str(args.n), "--threads", str(args.threads),
           "--json", "--temp", str(temp), "--seed", str(seed), "--spec-memory", args.spec_memory]
    if temp > 0:
        cmd += ["--top-k", "0", "--top-p", "1", "--min-p", "0"]
    if chat:
        cmd.append("--chat")
    cmd += args.model_args + extra
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if p.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr.decode(errors="replace")))
    last = p.stdout.decode("utf-8", errors="replace").rstrip("\n").rsplit("\n", 1)[-1]
    return json.loads(last)


def survival_rates(hist, width):
    """Per-position acceptance S(k)/S(k-1), k = 1..width-1, from an accept histogram."""
    s = [sum(hist[k:]) for k in range(len(hist) + 1)]
    rates = []
    for k in range(1, width):
        prev = s[k - 1] if k - 1 < len(s) else 0
        cur = s[k] if k < len(s) else 0
        rates.append(cur / prev if prev else float("nan"))
    return rates


def paired_ratio(results, mode):
    """Median over prompts of the mode's generation tok/s over plain decoding's on that prompt."""
    r = [m["tok_per_s"] / p["tok_per_s"] for p, m in zip(results["plain"], results[mode])
         if p["n_gen"] > 1 and m["n_gen"] > 1 and p["tok_per_s"] > 0]
    return statistics.median(r) if r else float("nan")


def summarize(results, mode):
    passes = sum(r["spec"]["passes"] for r in results[mode])
    accepted = sum(r["spec"]["accepted"] for r in results[mode])
    drafted = sum(r["spec"]["drafted"] for r in results[mode])
    plain_passes = sum(r["spec"].get("plain_passes", 0) for r in results[mode])
    hist = [0] * 9
    for r in results[mode]:
        for i, c in enumerate(r["spec"]["accept_hist"]):
            hist[i] += c
    timed = [r for r in results[mode] if r["n_gen"] > 1 and r["tok_per_s"] > 0]
    rates = [r["tok_per_s"] for r in timed]
    gen_tokens = sum(r["n_gen"] - 1 for r in timed)
    gen_s = sum((r["n_gen"] - 1) / r["tok_per_s"] for r in timed)
    ex = [r.get("experts", {}) for r in results[mode]]
    committed = passes + accepted
    read_s = sum(e.get("read_seconds", 0.0) for e in ex)
    return {
        "bytes_per_token": sum(e.get("gen_bytes_read", 0) for e in ex) / committed if committed else float("nan"),
        "read_gbs": sum(e.get("bytes_read", 0) for e in ex) / read_s / 1e9 if read_s > 0 else float("nan"),
        "tau": (passes + accepted) / passes if passes else float("nan"),
        "accepted": accepted,
        "drafted": drafted,
        "passes": passes,
        "plain_passes": plain_passes,
        "hist": hist,
        "pos": survival_rates(hist, 8),
        "tok_s": statistics.median(rates) if rates else float("nan"),
        "total_tok_s": gen_tokens / gen_s if gen_s > 0 else float("nan"),
        "n_gen": sum(r["n_gen"] for r in results[mode]),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ember", default=os.environ.get("EMBER_BIN", "build/ember"))
    ap.add_argument("--eval-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "eval"))
    ap.add_argument("-n", type=int, default=128, help="tokens generated per prompt (default 128)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=64, help="prompts per set (default 64)")
    ap.add_argument("--temps", default="0,0.7")
    ap.add_argument("--sets", default="humaneval,mt_bench")
    ap.add_argument("--json-out", help="also write every run's JSON summary here")
    ap.add_argument("--plain-only", action="store_true",
                    help="run only plain decoding (--draft none): its tok/s, e.g. before and after a change")
    ap.add_argument("--expert-cache", metavar="SIZE",
                    help="routed experts from storage through a cache of SIZE (e.g. 3MiB): adds bytes per token")
    ap.add_argument("--no-spec-memory", action="store_true",
                    help="every run starts without what earlier runs learnt (ember run --spec-memory off)")
    ap.add_argument("model_args", nargs="*", help="after --: -m TARGET --draft DRAFT (default: the default pair)")
    args = ap.parse_args()
    if args.expert_cache:
        args.model_args = args.model_args + ["--moe-storage", "ssd", "--expert-cache", args.expert_cache]
    sets = {"humaneval": ("humaneval_64.jsonl", False), "mt_bench": ("mt_bench_64.jsonl", True)}
    temps = [float(t) for t in args.temps.split(",")]
    all_rows, identical_ok, dump = [], True, []
    with tempfile.TemporaryDirectory() as tmp:
        args.spec_memory = "off" if args.no_spec_memory else os.path.join(tmp, "spec-memory")
        for name in args.sets.split(","):
            fname, chat = sets[name]
            prompts = load_prompts(os.path.join(args.eval_dir, fname), args.limit)
            files = []
            for i, text in enumerate(prompts):
                path = os.path.join(tmp, "%s_%d.txt" % (name, i))
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                files.append(path)
            modes = MODES[:1] if args.plain_only else MODES
            for temp in temps:
                results = {m: [] for m, _ in modes}
                for i, path in enumerate(files):
                    for mode, extra in modes:
                        results[mode].append(run_one(args, path, chat, temp, i + 1, extra))
                    print("\r%s T=%g: %d/%d" % (name, temp, i + 1, len(files)), end="", file=sys.stderr, flush=True)
                print(file=sys.stderr)
                row = {"set": name, "temp": temp, "n_prompts": len(files)}
                for mode, _ in modes:
                    row[mode] = summarize(results, mode)
                    row[mode]["paired"] = paired_ratio(results, mode)
                all_rows.append(row)
                dump.append({"set": name, "temp": temp, "runs": results})
                if args.plain_only:
                    print("%s T=%g: tok/s plain %.0f" % (name, temp, row["plain"]["tok_s"]), file=sys.stderr, flush=True)
                    continue
                if temp == 0:
                    for mode in SPEC_MODES:
                        same = sum(a["tokens"] == b["tokens"] for a, b in zip(results["plain"], results[mode]))
                        row["identical_" + mode] = same
                        identical_ok &= same == len(files)
                print("%s T=%g: tau spec %.2f, always %.2f, w8 %.2f; tok/s plain %.0f, spec %.0f, always %.0f, "
                      "w8 %.0f%s" % (name, temp, row["spec"]["tau"], row["always"]["tau"], row["w8"]["tau"],
                                     row["plain"]["tok_s"], row["spec"]["tok_s"], row["always"]["tok_s"],
                                     row["w8"]["tok_s"], "; greedy identical %s" % ", ".join(
                                         "%d/%d" % (row["identical_" + m], len(files)) for m in SPEC_MODES)
                                     if temp == 0 else ""), file=sys.stderr, flush=True)
    print_tables(all_rows, args)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(dump, f)
    if not identical_ok:
        print("FAIL: speculative greedy tokens differ from plain greedy tokens", file=sys.stderr)
        return 1
    return 0


def print_tables(rows, args):
    if args.plain_only:
        print("\n%d tokens per prompt, %d threads, plain decoding (--draft none); tok/s = median over prompts of "
              "generation tok/s (%s)\n" % (args.n, args.threads, args.ember))
        print("| set | temp | prompts | tok/s plain |")
        print("|---|---|---|---|")
        for r in rows:
            print("| %s | %g | %d | %.0f |" % (r["set"], r["temp"], r["n_prompts"], r["plain"]["tok_s"]))
        return
    print("\n%d tokens per prompt, %d threads; tok/s = median over prompts of generation tok/s; "
          "spec = the scheduler with --spec-policy auto (the default), always = the scheduler drafting every "
          "pass, w8 = --verify-width 8\n" % (args.n, args.threads))
    print("| set | temp | prompts | tau spec | tau always | tau w8 | plain passes of spec | tok/s plain "
          "| tok/s spec | spec/plain | tok/s always | always/plain | tok/s w8 | w8/plain "
          "| greedy identical (spec, always, w8) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p, s, a, w = r["plain"], r["spec"], r["always"], r["w8"]
        ident = (", ".join("%d/%d" % (r["identical_" + m], r["n_prompts"]) for m in SPEC_MODES)
                 if "identical_spec" in r else "n/a (sampled)")
        print("| %s | %g | %d | %.2f | %.2f | %.2f | %d/%d | %.0f | %.0f | %.2fx | %.0f | %.2fx | %.0f | %.2fx | %s |" % (
            r["set"], r["temp"], r["n_prompts"], s["tau"], a["tau"], w["tau"], s["plain_passes"], s["passes"],
            p["tok_s"], s["tok_s"], s["tok_s"] / p["tok_s"], a["tok_s"], a["tok_s"] / p["tok_s"], w["tok_s"],
            w["tok_s"] / p["tok_s"], ident))
    print("\nThe same against plain decoding two steadier ways: by total time (all prompts' generated tokens over "
          "their summed generation time) and the median over prompts of each prompt's own ratio (the ratio of "
          "medians above compares different prompts)\n")
    print("| set | temp | spec/plain total | always/plain total | w8/plain total | spec/plain per prompt "
          "| always/plain per prompt |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        t = {m: r[m]["total_tok_s"] / r["plain"]["total_tok_s"] for m in SPEC_MODES}
        print("| %s | %g | %.3fx | %.3fx | %.3fx | %.3fx | %.3fx |" % (
            r["set"], r["temp"], t["spec"], t["always"], t["w8"], r["spec"]["paired"], r["always"]["paired"]))
    if args.expert_cache:
        print("\nRouted experts from storage (--moe-storage ssd --expert-cache %s): bytes read per committed "
              "token (after the prompt), the ratio to plain decoding, and the read rate measured\n" % args.expert_cache)
        print("| set | temp | KB/token plain | spec | spec/plain | always | always/plain | w8 | w8/plain "
              "| read GB/s (plain, spec) |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            b = {m: r[m]["bytes_per_token"] for m in ("plain",) + SPEC_MODES}
            print("| %s | %g | %.0f | %.0f | %.2fx | %.0f | %.2fx | %.0f | %.2fx | %.2f, %.2f |" % (
                r["set"], r["temp"], b["plain"] / 1e3, b["spec"] / 1e3, b["spec"] / b["plain"], b["always"] / 1e3,
                b["always"] / b["plain"], b["w8"] / 1e3, b["w8"] / b["plain"], r["plain"]["read_gbs"],
                r["spec"]["read_gbs"]))
    print("\nPer-position acceptance, S(k)/S(k-1) from the summed accept_hist (w8: conditional acceptance "
          "of draft k; always: a lower bound, narrower verifies count as rejections)\n")
    print("| set | temp | mode | k=1 | k=2 | k=3 | k=4 | k=5 | k=6 | k=7 | accept_hist 0..7 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        for mode in ("w8", "always"):
            m = r[mode]
            print("| %s | %g | %s | %s | %s |" % (r["set"], r["temp"], mode, " | ".join("%.2f" % x for x in m["pos"]),
                                                  " ".join(str(c) for c in m["hist"][:8])))


if __name__ == "__main__":
    sys.exit(main())
