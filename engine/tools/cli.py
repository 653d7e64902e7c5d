"""`sluice` command line (the contract in README.md, "Command line"). Errors: one sentence on stderr, non-zero exit."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from engine.errors import SluiceError, allocation_sentence, fs_error_sentence
from engine.options import Options

EXIT_USER_ERROR = 2
# kernels.formats.FORMATS, written out: building the parser must not import torch (tests check they agree)
QUANTS = ("bf16", "fp8", "int8", "nvfp4", "mxfp4")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice", description="Run huge Mixture-of-Experts models by streaming experts from disk.",
        epilog="Run `sluice` with no command to open the desktop app. `sluice COMMAND --help` explains a command.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_repack(sub)
    _add_generate(sub)
    _add_download(sub)
    _add_bench(sub)
    sub.add_parser("install-launcher", help="add Sluice to the applications menu and desktop")
    _add_serve(sub)
    _add_demo(sub)
    return parser


def _add_repack(sub) -> None:
    p = sub.add_parser("repack", help="turn a Hugging Face snapshot into a Sluice model folder")
    p.add_argument("src_dir", help="the Hugging Face snapshot folder (config.json and .safetensors files)")
    p.add_argument("dst_dir", help="the Sluice model folder to create")
    p.add_argument("--quant", choices=QUANTS, default="bf16",
                   help="format of the expert weights: bf16 (lossless, default), fp8 or int8 (half the bytes), "
                        "nvfp4 or mxfp4 (a quarter; mxfp4 keeps gpt-oss's own blocks as they are)")


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt")
    p.add_argument("model_dir", help="a Sluice model folder (a Hugging Face snapshot is repacked on the fly)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-ids", help="comma-separated token ids, e.g. 1,2,3")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--system", help="system prompt (with --chat)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="most tokens to generate (default 128)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature; 0 = greedy, the default here, for reproducible output "
                        "(the app's chats default to 0.7)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep the most likely tokens "
                                                             "up to this probability mass (default 1.0: all)")
    p.add_argument("--top-k", type=int, default=0, help="keep only the k most likely tokens (default 0: off)")
    p.add_argument("--seed", type=int, help="random seed for sampling (default: a new one each run)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", help="structured output: the answer follows this JSON Schema (a file or JSON text)")
    shape.add_argument("--response-format", help='structured output as the OpenAI API takes it, e.g. '
                                                 '\'{"type": "json_object"}\' or {"type": "regex", "regex": "..."}')
    _add_engine_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object: token_ids, text, telemetry")


def _add_download(sub) -> None:
    p = sub.add_parser("download", help="download a model from the Hugging Face hub")
    p.add_argument("repo_id", help="the model on the hub, as owner/name or its address")
    p.add_argument("--revision", help="a branch, tag or commit (default: the newest)")
    p.add_argument("--dir", dest="dst_dir", help="where to put it (default: .downloads/owner--name in the app's models folder)")


def _add_bench(sub) -> None:
    p = sub.add_parser(
        "bench", help="benchmark a preset model with budgets that force streaming",
        description="A random-weight model with a real architecture's dimensions, run through Engine.generate under "
                    "budgets that force streaming, against the roofline of bandwidths measured in the same run. "
                    "Without a GPU, --device cpu runs it (slowly: try --prompt-tokens 128 --new-tokens 16).")
    p.add_argument("--preset", required=True, help="whose dimensions, e.g. olmoe-1b-7b or qwen3-30b-a3b (a name it does not know lists them all)")
    p.add_argument("--quant", choices=QUANTS, default="fp8", help="expert format (default fp8)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--vram-budget", help="e.g. 4GB; what the driver shows for the process (on the CPU: the slots)")
    p.add_argument("--ram-cache", help="e.g. 16GB; RAM cache of expert blocks")
    p.add_argument("--dtype", choices=["bfloat16", "float32"],
                   help="compute dtype (default: bfloat16 on a GPU, float32 on the CPU)")
    p.add_argument("--dense-quant", choices=["int8"], help="dense weights as int8 (llama.cpp's Q8_0 quantises them too)")
    p.add_argument("--prompt-tokens", type=int, default=2048, help="prompt length (default 2048)")
    p.add_argument("--new-tokens", type=int, default=256, help="tokens to decode (default 256)")
    p.add_argument("--top-k", type=int, default=0, help="sample the decode with top-k as well (the app's default: 40)")
    p.add_argument("--top-p", type=float, default=1.0, help="sample the decode with top-p as well (the app's default: 0.95)")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs and no Triton kernels (same as --set eager=true)")
    p.add_argument("--copy-rate-gbps", type=float, metavar="GBPS",
                   help="simulate a slower PCIe link: host<->device copies paced to this rate, e.g. 25 for a PCIe 4.0 "
                        "x16 card (same as --set copy_rate_gbps=GBPS); the report says the copies were paced")
    _add_settings(p)
    p.add_argument("--work-dir", help="where preset models are built and kept (default: the user cache dir)")
    p.add_argument("--via-repack", action="store_true", help="build a bf16 HF checkpoint and repack it (product path)")
    p.add_argument("--baseline", choices=["accelerate"], help="also run this reference engine for comparison")
    p.add_argument("--baseline-new-tokens", type=int, default=8, help="tokens the baseline decodes (default 8)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the results")
    # memory caps and the llama.cpp peer need the repository's bench tree: these get a sentence saying so
    for flag in ("--regime", "--llama-bench"):
        p.add_argument(flag, help=argparse.SUPPRESS)


def _add_settings(p) -> None:
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                   help="an engine option (engine/options.py: eager, cpu_experts, cpu_kernel, ram_fill, "
                        "prefetch_reads, prefetch_copies, kernel_warmup, copy_rate_gbps), e.g. --set ram_fill=false; "
                        "repeatable")


def _add_serve(sub) -> None:
    p = sub.add_parser("serve", help="HTTP server speaking the OpenAI (chat, completions, responses), Anthropic Messages "
                                          "and Ollama APIs")
    p.add_argument("model_dir", help="a Sluice model folder (a Hugging Face snapshot is repacked on the fly)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this computer only)")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed at start)")
    p.add_argument("--api-key", default=os.environ.get("SLUICE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $SLUICE_API_KEY)")
    p.add_argument("--ctx", type=int, help="context length in tokens (prompt + answer); default: the model's")
    p.add_argument("--max-queue", type=int, default=8, help="requests that may wait while one generates (at least 1)")
    p.add_argument("--allowed-hosts", type=_names, default=[], metavar="NAMES",
                   help="comma-separated host names the server answers besides localhost and --host ('*': any); "
                        "refusing the others keeps DNS-rebinding web pages out")
    p.add_argument("--allowed-origins", type=_names, default=[], metavar="ORIGINS",
                   help="comma-separated web page origins (e.g. http://localhost:3000) allowed to call the server "
                        "from a browser ('*': any); default none")
    _add_engine_options(p)


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="build the demo model (a tiny random-weight MoE, no download; it produces noise)")
    p.add_argument("--dir", dest="dst_dir", help="the folder to build it in (default: sluice-demo-random-moe in the "
                                                 "app's models folder, where the app finds it)")


def _names(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


def _add_engine_options(p) -> None:
    """Where the engine runs and its budgets (generate, serve)."""
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--dtype", help="compute dtype: float32 (CPU default) or bfloat16 (CUDA default)")
    p.add_argument("--vram-budget", help="e.g. 8GB; covers dense weights, KV cache and expert slots")
    p.add_argument("--ram-cache", help="e.g. 16GB; RAM cache of expert blocks")
    p.add_argument("--dense-quant", choices=["int8"],
                   help="keep the dense weights as int8 (half their VRAM goes to expert slots); default: as stored")
    _add_settings(p)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    _log_warnings_to_stderr()
    try:
        return _COMMANDS[args.command](args)
    except SluiceError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as exc:            # a full or read-only disk, a permission, a file where a folder should be
        sentence = fs_error_sentence(exc) or allocation_sentence(exc) or \
            f"{exc.strerror or exc} ('{exc.filename}'); check the path and try again."
        print(f"sluice: {sentence}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:           # e.g. `sluice generate ... | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("sluice: interrupted.", file=sys.stderr)
        return 130
    except (MemoryError, RuntimeError) as exc:     # RuntimeError: torch's allocators report failures so
        sentence = allocation_sentence(exc)
        if sentence is None:
            raise
        print(f"sluice: {sentence}", file=sys.stderr)
        return 1


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (tests swap it between calls)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _log_warnings_to_stderr() -> None:
    """The engine's warnings (waiting for another process's lock, a partial repack healed) reach the user."""
    logger = logging.getLogger("sluice")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setLevel(logging.WARNING)
        handler.setFormatter(logging.Formatter("sluice: %(message)s"))
        logger.addHandler(handler)


def _repack(args) -> int:
    from tqdm import tqdm
    from engine.format.repack import repack
    bars = []            # made at the first progress report: a source refused at once prints no empty bar

    def progress(done, total, message):
        if not bars:
            bars.append(tqdm(total=total, unit="step", file=sys.stderr, desc="repack"))
        bar = bars[0]
        bar.total = total
        bar.n = done
        bar.set_postfix_str(message)
        bar.refresh()
    try:
        dst = repack(args.src_dir, args.dst_dir, quant=args.quant, progress=progress)
    finally:
        for bar in bars:
            bar.close()
    print(f"Repacked into {dst}", file=sys.stderr)
    return 0


def _generate(args) -> int:
    import engine
    from engine.params import GenerationParams
    if args.prompt_ids is not None:
        try:
            prompt = [int(x) for x in args.prompt_ids.split(",") if x.strip()]
        except ValueError:
            raise SluiceError("--prompt-ids must be comma-separated integers, like 1,2,3.") from None
    elif args.chat:
        prompt = ([{"role": "system", "content": args.system}] if args.system else []) + \
                 [{"role": "user", "content": args.prompt}]
    else:
        prompt = args.prompt
    params = GenerationParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                              top_k=args.top_k, seed=args.seed, stop=args.stop, grammar=_grammar(args))
    params.validate()                 # before loading: the engine checks again, with the vocabulary
    eng = engine.load(args.model_dir, device=args.device, vram_budget=args.vram_budget, ram_cache=args.ram_cache,
                      dtype=args.dtype, dense_quant=args.dense_quant, options=Options.parse(args.settings))
    try:
        token_ids, pieces = [], []
        for event in eng.generate(prompt, params):
            if event.token_id is not None and event.finish_reason not in ("eos",):
                token_ids.append(event.token_id)
            pieces.append(event.text)
            if not args.json and event.text:
                sys.stdout.write(event.text)
                sys.stdout.flush()
        if args.json:
            tel = eng.telemetry()
            print(json.dumps({"token_ids": token_ids, "text": "".join(pieces), "telemetry": tel}, ensure_ascii=False))
        else:
            tel = eng.telemetry()["speed"]
            sys.stdout.write("\n")
            print(f"[{len(token_ids)} tokens, prefill {tel['prefill_tok_s']:.1f} tok/s, decode {tel['decode_tok_s']:.1f} tok/s, "
                  f"TTFT {tel['ttft_s']:.3f} s]", file=sys.stderr)
    finally:
        eng.close()
    return 0


def _grammar(args) -> str | None:
    """--json-schema / --response-format -> the grammar the engine enforces (engine.grammar)."""
    from engine.grammar import grammar_for
    text = args.json_schema or args.response_format
    if text is None:
        return None
    if Path(text).is_file():
        text = Path(text).read_text()
    flag = "--json-schema" if args.json_schema else "--response-format"
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise SluiceError(f"{flag} is not valid JSON ({exc}).") from None
    if not isinstance(value, dict):
        raise SluiceError(f"{flag} must be a JSON object.")
    return grammar_for({"type": "json_schema", "json_schema": {"schema": value}} if args.json_schema else value)


def _download(args) -> int:
    try:
        from engine.tools.cli_download import run
    except ImportError:
        raise SluiceError("Downloading is not available in this build of Sluice.") from None
    return run(args)


def _bench(args) -> int:
    try:
        from engine.tools.bench import run
    except ImportError:
        raise SluiceError("Benchmarks are not available in this build of Sluice.") from None
    return run(args)


def _install_launcher(args) -> int:
    raise SluiceError("Run `sluice install-launcher` from an installed Sluice (it is handled by the desktop app).")


def _serve(args) -> int:
    import engine
    from engine.serve import Server, is_loopback
    from engine.serve.server import check_settings
    if args.ctx is not None and args.ctx < 2:
        raise SluiceError("--ctx must be at least 2 tokens.")
    check_settings(args.port, args.api_key, args.max_queue)      # before the model loads, which takes a while
    if not is_loopback(args.host) and not args.api_key:
        print(f"sluice: warning: serving on {args.host} without --api-key: anyone who can reach this computer "
              f"can use the model.", file=sys.stderr)
    eng = engine.load(args.model_dir, device=args.device, vram_budget=args.vram_budget, ram_cache=args.ram_cache,
                      dtype=args.dtype, max_context=args.ctx, dense_quant=args.dense_quant,
                      options=Options.parse(args.settings))
    try:
        def log_request(r: dict) -> None:
            print(f"{r['client']} {r['method']} {r['path']} {r['status']} {r['duration_s'] * 1000:.0f} ms",
                  file=sys.stderr, flush=True)
        server = Server(eng, host=args.host, port=args.port, api_key=args.api_key, max_waiting=args.max_queue,
                        on_request=log_request, allowed_hosts=args.allowed_hosts,
                        allowed_origins=args.allowed_origins)
        print(f"Sluice is serving {server.service.model_id} at {server.url} "
              f"(OpenAI API: {server.url}/v1, Ollama API: {server.url}/api); Ctrl+C stops.", flush=True)
        try:
            server.run()
        except KeyboardInterrupt:          # Ctrl+C is how a server is stopped
            print("sluice: server stopped.", file=sys.stderr)
    finally:
        eng.close()
    return 0


def _demo(args) -> int:
    """The app's "Try the demo model", headless: built once, then found where it is."""
    import shlex
    from engine.tools.user_models import user_models_dir
    from engine.tools.demo import DEMO_DIR_NAME, build_demo_model, is_demo_model
    dst = Path(args.dst_dir).expanduser() if args.dst_dir else user_models_dir() / DEMO_DIR_NAME
    if not is_demo_model(dst):
        from transformers.utils import logging as transformers_logging
        transformers_logging.disable_progress_bar()         # its bar for a 1-shard save is noise here
        said = []

        def progress(*_) -> None:                           # the first report comes once the folder is checked
            if not said:
                print("Building the demo model (a tiny random-weight MoE: its answers are noise)…", file=sys.stderr)
                said.append(True)
        build_demo_model(dst, progress=progress)
    where, sluice = shlex.quote(str(dst)), _program()
    print(f"The demo model is in {dst}\n"
          f"Chat with it:  {sluice} generate {where} --chat --prompt 'Hello'\n"
          f"Serve it:      {sluice} serve {where}", file=sys.stderr)
    print(dst)
    return 0


def _program() -> str:
    """How to run this CLI again from here: `sluice` where the shell finds this one, else its path
    (`.venv/bin/sluice` after the README's install, which puts nothing on PATH)."""
    import shlex
    import shutil
    me = Path(sys.argv[0])
    if me.name != "sluice":                         # run as a module (python -m app.main) or by a test
        return "sluice"
    found = shutil.which("sluice")
    if found and Path(found).resolve() == me.resolve():
        return "sluice"
    me = me.resolve()
    return shlex.quote(str(me.relative_to(Path.cwd()) if me.is_relative_to(Path.cwd()) else me))


_COMMANDS = {"repack": _repack, "generate": _generate, "download": _download, "bench": _bench,
             "install-launcher": _install_launcher, "serve": _serve, "demo": _demo}


if __name__ == "__main__":
    sys.exit(main())
