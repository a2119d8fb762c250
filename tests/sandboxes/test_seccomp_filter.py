"""The local backend's seccomp program, run through a classic-BPF interpreter written here from
linux/filter.h: every syscall number of both ABIs gets exactly the verdict the deny-list says."""

from __future__ import annotations

import struct

import pytest

from vime.sandboxes import seccomp
from vime.sandboxes.base import SandboxError

ALLOW, EPERM = 0x7FFF0000, 0x00050001
ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def run_filter(program: bytes, nr: int, arch: int) -> int:
    """Evaluate a seccomp cBPF program (the subset a filter of loads, jumps and returns uses)."""
    insns = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    data = {0: nr, 4: arch}
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]  # an IndexError here is a jump out of the program
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc = data[k]
            pc += 1
        elif code in (0x15, 0x35):  # BPF_JMP | BPF_JEQ / BPF_JGE, constant operand
            taken = acc == k if code == 0x15 else acc >= k
            pc += 1 + (jt if taken else jf)
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x} at {pc}")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_every_syscall_number_gets_the_deny_lists_verdict(machine):
    program = seccomp.build(machine)
    denied = set(seccomp._ARCHES[machine][1].values())
    assert len(program) // 8 < 4096  # the kernel's BPF_MAXINSNS
    for nr in range(0, 1100):
        want = EPERM if nr in denied else ALLOW
        assert run_filter(program, nr, ARCH[machine]) == want, nr
    assert len(denied) > 40


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_a_foreign_architecture_is_denied_whatever_the_number(machine):
    program = seccomp.build(machine)
    for arch in (0x40000003, 0x40000028, 0xC00000B7 if machine == "x86_64" else 0xC000003E):
        for nr in (0, 1, 59, 221, 425):
            assert run_filter(program, nr, arch) == EPERM


def test_x32_numbers_are_denied_on_x86_64():
    program = seccomp.build("x86_64")
    for nr in (0x40000000, 0x40000000 + 59, 0x40000000 + 513, 0xFFFFFFFF):
        assert run_filter(program, nr, ARCH["x86_64"]) == EPERM


def test_the_syscalls_a_program_needs_are_allowed():
    program = seccomp.build("x86_64")
    # read, write, openat, mmap, clone, execve, exit_group, futex, clone3, getrandom
    for nr in (0, 1, 257, 9, 56, 59, 231, 202, 435, 318):
        assert run_filter(program, nr, ARCH["x86_64"]) == ALLOW, nr


def test_an_unknown_machine_is_refused_with_a_way_out():
    with pytest.raises(SandboxError, match=r"no seccomp filter for 'riscv64'.*docker backend"):
        seccomp.build("riscv64")
