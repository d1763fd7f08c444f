"""Training: one loop for every task, with schedules, checkpoints and run directories.

    config.py       TrainConfig (frozen, validated, JSON round trip); DEFAULTS, the one table of
                    what None means, read by resolve_defaults and `lamina train --help`;
                    parse_duration
    build.py        device and bf16 choice; the task and model a config names (build_lm,
                    build_first_last)
    inputs.py       a language model's tokens (raw text, or a `lamina prepare` folder read
                    through memory maps) and first weights (seeded, or --init-from)
    finetune.py     --init-from SOURCE: a lamina or Hugging Face model, its shape and tokenizer
    tasks.py        the loop's model interface: LMTask (corpus windows), FirstLastTask (the
                    encoder's toy task); split_loss / summary for `lamina eval`
    optim.py        parameter groups (decay on >= 2-D weights, tied once, per-group lr_scale),
                    AdamW or Muon (muon.py), pickle-free state; the warmup + cosine/linear/wsd
                    schedule; TimeBudget for --max-time
    muon.py         MuonAdamW: Muon for the blocks' matrices, AdamW for the rest
    session.py      a run's model/optimizer/task/run dir, fresh or resumed; save_checkpoint,
                    the one save path
    run_dir.py      the run directory layout and staged, atomic checkpoint files
    loop.py         train_step, evaluate, run_training
    distributed.py  joining torchrun's processes; DDP / FSDP2; gathering a sharded checkpoint
    progress.py     tqdm bar or plain lines; loss.png
    classify.py     --task classify: labelled texts, ClassifyTask, build_classify, predict_proba
    classify_metrics.py   confusion matrix, accuracy / macro-F1 / per-class scores, its PNG

The built-in corpus lives in the data layer (`lamina.data.builtin`).

Typical use from Python:

    from lamina.training.config import TrainConfig
    from lamina.training.session import new_session
    from lamina.training.loop import run_training
    result = run_training(new_session(TrainConfig(data="input.txt", max_time=60), out="run"))
"""
