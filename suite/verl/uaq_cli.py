"""`suite uaq apply|undo --s S IN_DIR OUT_DIR`: UAQ on a Hugging Face safetensors checkpoint."""

from __future__ import annotations

import argparse
import sys


def cmd_uaq(args: argparse.Namespace) -> int:
    import math

    from suite.verl.hf_uaq import UAQError, transform

    # checked before any file is read: s scales norms and divides linears, so it must be finite and > 0
    if not (math.isfinite(args.s) and args.s > 0):
        print(f"suite uaq: --s={args.s}: must be a finite number > 0 (the paper's default is 1.5)", file=sys.stderr)
        return 2
    if args.verify_layers < 1:
        print(f"suite uaq: --verify-layers={args.verify_layers}: must be >= 1 (apply always checks invariance)",
              file=sys.stderr)
        return 2
    try:
        transform(args.in_dir, args.out_dir, args.s, undo=args.op == "undo", verify_layers=args.verify_layers)
    except (UAQError, ValueError) as exc:
        print(f"suite uaq: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out_dir}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "uaq", help="UAQ invariant scaling of a Hugging Face checkpoint (apply / undo)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="QuRL's update-aware quantization by invariant scaling on a Hugging Face checkpoint: `apply`\n"
                    "multiplies each RMSNorm gain by s and divides the weights it feeds (q/k/v, gate/up) by s (the\n"
                    "network's function is unchanged; an RL update grows against the quantization step), `undo`\n"
                    "reverses it, e.g. to export a trained model.\n"
                    "Written to a new directory; docs/math.md has the derivation.\n\n"
                    "    suite uaq apply --s 1.5 models/Qwen2.5-7B models/Qwen2.5-7B-uaq1.5")
    p.add_argument("op", choices=("apply", "undo"))
    p.add_argument("--s", type=float, required=True, help="UAQ scale (paper default 1.5)")
    p.add_argument("--verify-layers", type=int, default=2, help="blocks run in the invariance check after apply")
    p.add_argument("in_dir", help="input model directory (never modified)")
    p.add_argument("out_dir", help="new directory (absent or empty)")
    p.set_defaults(func=cmd_uaq)
