"""Training: loops, schedules and run directories, built on the layers below.

    config.py      TrainConfig (validated, JSON round trip), parse_duration
    setup.py       defaults for the data and budget, device and dtype choice, building pieces
    tasks.py       the loop's model interface: LMTask (corpus windows), FirstLastTask
    optim.py       AdamW groups (decay on >= 2-D weights, tied once), pickle-free state
    schedule.py    warmup + cosine/linear decay to a floor; TimeBudget for --max-time
    session.py     a run's model/optimizer/task/run dir, fresh or resumed; checkpoints
    loop.py        train_step, evaluate, run_training
    run_dir.py     the run directory layout and staged, atomic checkpoints
    evaluation.py  full validation-split loss for `lamina eval`
    progress.py    tqdm bar or plain lines; plots.py: loss.png; corpus.py: built-in corpus
    classify.py    the seed encoder's first-last recipe (`lamina task first-last`)

Typical use from Python:

    from lamina.training.config import TrainConfig
    from lamina.training.session import new_session
    from lamina.training.loop import run_training
    result = run_training(new_session(TrainConfig(data="input.txt", max_time=60), out="run"))
"""
