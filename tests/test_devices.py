"""Device-specific branches, run on a CPU where a CPU can run them: a reference model on its own
device, the dtype choices for devices that cannot be measured, device names that do not exist
here. What needs a GPU (CUDA kernels, NCCL, bf16 speed on a GPU, Apple's MPS) is listed in the
docs/gpu.md under "Untested on real hardware"; the two-rank tests cover the rest of torchrun's path
with gloo (tests/test_distributed.py, including the mapping of a bare `cuda` to each rank's GPU).
"""

import pytest
import torch
from test_trainer import make, varied_reward

from rookworld_rlvr.grpo import distributed as dist
from rookworld_rlvr.grpo.precision import autocast_dtype, backward_dtype
from rookworld_rlvr.grpo.runlog import banner
from rookworld_rlvr.model import load_policy, resolve_device


def test_a_reference_on_its_own_device_is_frozen_and_a_resume_reloads_it_from_the_base(tmp_path, tiny_model_dir,
                                                                                        small_data):
    """ref_device: the reference is a separate frozen copy on that device (here the CPU, as a CPU
    offload next to a GPU policy would be); step 0 has KL 0; after a resume the reference is the base
    model again, not the trained policy the run resumes."""
    tr = make(tmp_path, tiny_model_dir, small_data, None, varied_reward, ref_device="cpu", kl_coef=0.1, steps=1)
    assert tr.ref_device == torch.device("cpu") and tr.ref is not tr.policy and "reference on cpu" in banner(tr)
    assert not any(p.requires_grad for p in tr.ref.parameters()) and not tr.ref.training
    tr.train()
    assert tr.step == 1
    base, _ = load_policy(str(tiny_model_dir), device="cpu", verbose=False)
    resumed = make(tmp_path, tiny_model_dir, small_data, None, varied_reward, ref_device="cpu", kl_coef=0.1,
                   steps=2, resume=True)
    assert resumed.step == 1
    ref, policy = list(resumed.ref.parameters()), list(resumed.policy.parameters())
    assert all(torch.equal(p, q) for p, q in zip(ref, base.parameters(), strict=True))  # the base, reloaded
    assert any(not torch.equal(p, q) for p, q in zip(ref, policy, strict=True))  # not the resumed policy


def test_dtype_choices_on_devices_without_a_measurement(tiny_model_dir):
    model, _ = load_policy(str(tiny_model_dir), device="cpu", verbose=False)
    mps = torch.device("mps")  # a device object only: nothing runs on it
    assert backward_dtype("auto", model, None, mps) == (None, "float32 (auto: no bf16 measurement on mps)")
    assert backward_dtype("bf16", model, None, mps)[0] == torch.bfloat16  # asked for: no measurement needed
    assert autocast_dtype("auto", mps) is None and autocast_dtype("bf16", mps) == torch.bfloat16
    assert autocast_dtype("none", torch.device("cuda")) is None
    with pytest.raises(ValueError, match="float32 contradicts bf16 autocast"):
        backward_dtype("float32", model, torch.bfloat16, mps)


def test_devices_that_are_not_here_are_clear_errors():
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")
    if not torch.backends.mps.is_available():
        with pytest.raises(ValueError, match="MPS is not available"):
            resolve_device("mps")
    with pytest.raises(ValueError, match="unsupported device"):
        resolve_device("meta")
    assert dist.local_device(torch.device("cuda")) == torch.device("cuda")  # one process: left as asked


def test_on_cuda_our_forwards_attend_without_cudnn_and_put_the_choice_back():
    """cuDNN's attention builds an execution graph for every new shape (3.9 ms of host time a call on an H200,
    and our passes change shape with every batch): `device_context`, which every forward of ours runs under,
    takes it out of scaled-dot-product attention's choices on CUDA and puts the process's setting back after.
    Elsewhere it only autocasts where asked. (Flags only here; tests/gpu profiles the kernels a step runs.)"""
    from rookworld_rlvr.model.generate import device_context

    cuda = torch.backends.cuda

    def choices() -> tuple[bool, bool, bool, bool]:
        return cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), \
            cuda.math_sdp_enabled()

    before = choices()
    with device_context(torch.device("cuda"), None):
        assert choices() == (False, True, True, True) and not torch.is_autocast_enabled("cuda")
    assert choices() == before
    with pytest.raises(RuntimeError, match="inside"), device_context(torch.device("cuda"), None):
        raise RuntimeError("a failure inside")
    assert choices() == before
    with device_context(torch.device("cpu"), torch.bfloat16):
        assert choices() == before and torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    with device_context(torch.device("cpu"), None):
        assert not torch.is_autocast_enabled("cpu")
