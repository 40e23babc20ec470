"""GRPO: the trainer (`trainer`) and its parts, one concern each.

    prompts.py      which training prompts come next (resumable, the same on every rank)
    rollout.py      G completions per prompt, scored; the padded batch with advantages
    passes.py       log-prob passes over a batch: reference, old policy, policy
    loss.py         the GRPO objective, advantages and KL estimators (pure tensor math)
    step.py         one update's arithmetic: minibatch loss, metric rules, optimizer step
    anchor.py       the supervised anchor loss next to GRPO's (PPO-ptx)
    control.py      β, reward normaliser, optimizer and LR schedule, curriculum
    guards.py       the non-finite and collapse guards
    monitor.py      warnings that name a symptom's cause
    state.py        what a checkpoint holds; save, snapshot, rollback
    runlog.py       metrics.jsonl and the other run logs
    sinks.py        each step to TensorBoard and wandb (sft's too), resumed where the checkpoint stands
    precision.py    autocast, bf16 backward products, recorded rollouts
    lora.py         peft adapters and the merged sampler
    checkpoint.py   atomic checkpoint directories
    distributed.py  the collectives (torchrun)
    cli.py          `rookworld train | check-batch | overfit`; sanity.py, dryrun.py their checks

Owns training. Imports torch and the model package; chess comes in only through `cli.build`
(the reward and evaluation functions).
"""
