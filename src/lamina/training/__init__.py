"""Training: one loop for every task, with schedules, checkpoints and run directories.

    config.py       TrainConfig, the shared fields (frozen, validated, JSON out), each made by
                    `defaults.option(...)` with its help and default beside it; DEFAULTS, the
                    one table of what None means; plan_batch
    defaults.py     option() and Default: a field's help, flag and what None means, beside it
    registry.py     the training tasks in one table (lm, first-last, classify): each one
                    module with its options dataclass, build() and finished(); make_config /
                    load_config (old flat configs too) and resolve, the one place defaults
                    are filled
    lm.py           --task lm: a language model's tokens (raw text, or a `lamina prepare`
                    folder read through memory maps), first weights (seeded, or --init-from),
                    LMObjective
    finetune.py     --init-from SOURCE: a lamina or Hugging Face model, its shape and tokenizer
    lora_option.py  --lora's fields and what a LoRA run saves; qlora.py: --lora-base, the
                    frozen base kept quantized (a GGUF file's blocks as stored)
    sft.py          --task sft: chats / instructions, assistant-only loss, --val-data
    first_last.py   --task first-last: the encoder classifier's toy task
    classify.py     --task classify: labelled texts, ClassifyObjective, predict_proba
    classify_metrics.py   confusion matrix, accuracy / macro-F1 / per-class scores, its PNG
    objectives.py   the loop's interface to a task (Objective), Batch, Built, RNG text
    split_loss.py   a whole split scored (split_loss, summary) and an evaluation in words
    device.py       device choice, the bf16 policy, whether a model fits in memory
    optim.py        parameter groups (decay on >= 2-D weights, tied once, per-group lr_scale),
                    AdamW or Muon (muon.py), pickle-free state
    schedule.py     the warmup + cosine/linear/wsd schedule; TimeBudget for --max-time;
                    parse_duration
    sizing.py       --max-time: a probe step sizes the batch, evaluations and warmup to it
    recompute.py    --activation-checkpointing: blocks recomputed in the backward
    heap.py         lean_heap: glibc's freed pages handed back during a training step
                    (`lamina train` on a CPU; --no-heap-trim)
    muon.py         MuonAdamW: Muon for the blocks' matrices, AdamW for the rest
    session.py      a run's parts (Session, frozen) and position (RunState), fresh or resumed;
                    Placement; save_checkpoint, the one save path
    run_dir.py      the run directory layout and staged, atomic checkpoint files
    loop.py         train_step, evaluate, run_training (in named steps: plan, step, log, ...)
    distributed.py  joining torchrun's processes; place() -> Placement (DDP / FSDP2); gathering
                    a sharded checkpoint
    progress.py     tqdm bar or plain lines; a heartbeat inside long steps

The built-in corpus lives in the data layer (`lamina.data.builtin`).

Typical use from Python:

    from lamina.training.config import TrainConfig
    from lamina.training.session import new_session
    from lamina.training.loop import run_training
    result = run_training(new_session(TrainConfig(data="input.txt", max_time=60), out="run"))
"""
