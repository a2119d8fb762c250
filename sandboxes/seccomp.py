"""The seccomp filter of the ``local`` backend: a classic BPF program that makes the syscalls
Docker's default profile denies fail with EPERM (keyrings, io_uring, perf, bpf, ptrace, mounts,
namespaces, kernel modules, clocks, ...), for bubblewrap's ``--seccomp FD``."""

from __future__ import annotations

import functools
import json
import os
import platform
import struct

from vime.sandboxes.base import SandboxError

# The syscalls denied inside the sandbox, by name and number per architecture. Sandboxed code
# needs none of them; each one is either a kernel attack surface (io_uring, bpf, perf_event_open, userfaultfd), reaches host
# state the namespaces do not cover (keyrings, clocks, kernel modules, swap, reboot, syslog),
# inspects other processes (ptrace, process_vm_*, kcmp, pidfd_getfd) or rebuilds the mount and
# namespace layout (mount API, pivot_root, chroot, unshare, setns, file handles).
# (Numbers from the kernel's uapi headers; aarch64 lacks some of the legacy ones.)
_X86_64 = {
    "_sysctl": 156, "acct": 163, "add_key": 248, "bpf": 321, "chroot": 161,
    "clock_adjtime": 305, "clock_settime": 227, "create_module": 174, "delete_module": 176,
    "fanotify_init": 300, "finit_module": 313, "fsconfig": 431, "fsmount": 432, "fsopen": 430,
    "fspick": 433, "get_kernel_syms": 177, "get_mempolicy": 239, "init_module": 175,
    "io_uring_enter": 426, "io_uring_register": 427, "io_uring_setup": 425, "ioperm": 173,
    "iopl": 172, "kcmp": 312, "kexec_file_load": 320, "kexec_load": 246, "keyctl": 250,
    "lookup_dcookie": 212, "mbind": 237, "mount": 165, "mount_setattr": 442, "move_mount": 429,
    "move_pages": 279, "name_to_handle_at": 303, "nfsservctl": 180, "open_by_handle_at": 304,
    "open_tree": 428, "perf_event_open": 298, "pidfd_getfd": 438, "pivot_root": 155,
    "process_vm_readv": 310, "process_vm_writev": 311, "ptrace": 101, "query_module": 178,
    "quotactl": 179, "quotactl_fd": 443, "reboot": 169, "request_key": 249,
    "set_mempolicy": 238, "setns": 308, "settimeofday": 164, "swapoff": 168, "swapon": 167,
    "syslog": 103, "sysfs": 139, "umount2": 166, "unshare": 272, "uselib": 134,
    "userfaultfd": 323, "ustat": 136, "vhangup": 153,
}  # fmt: skip
DENIED = frozenset(_X86_64)
_AARCH64 = {
    "acct": 89, "add_key": 217, "bpf": 280, "chroot": 51, "clock_adjtime": 266,
    "clock_settime": 112, "delete_module": 106, "fanotify_init": 262, "finit_module": 273,
    "fsconfig": 431, "fsmount": 432, "fsopen": 430, "fspick": 433, "get_mempolicy": 236,
    "init_module": 105, "io_uring_enter": 426, "io_uring_register": 427, "io_uring_setup": 425,
    "kcmp": 272, "kexec_file_load": 294, "kexec_load": 104, "keyctl": 219,
    "lookup_dcookie": 18, "mbind": 235, "mount": 40, "mount_setattr": 442, "move_mount": 429,
    "move_pages": 239, "name_to_handle_at": 264, "nfsservctl": 42, "open_by_handle_at": 265,
    "open_tree": 428, "perf_event_open": 241, "pidfd_getfd": 438, "pivot_root": 41,
    "process_vm_readv": 270, "process_vm_writev": 271, "ptrace": 117, "quotactl": 60,
    "quotactl_fd": 443, "reboot": 142, "request_key": 218, "set_mempolicy": 237, "setns": 268,
    "settimeofday": 170, "swapoff": 225, "swapon": 224, "syslog": 116, "umount2": 39,
    "unshare": 97, "userfaultfd": 282, "vhangup": 58,
}  # fmt: skip
# machine -> (AUDIT_ARCH_* of its native syscalls, syscall numbers)
_ARCHES = {"x86_64": (0xC000003E, _X86_64), "aarch64": (0xC00000B7, _AARCH64)}
_X32_BIT = 0x40000000  # x86_64's x32 ABI: the same syscalls under other numbers

# Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
_LD_ABS_W = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build(machine: str) -> bytes:
    """The filter for ``machine`` (``platform.machine()``): EPERM for the denied syscalls and
    for every syscall of a foreign ABI (32-bit, x32), which would bypass a per-number list."""
    if machine not in _ARCHES:
        raise SandboxError(
            f"the local sandbox has no seccomp filter for {machine!r} (only for "
            f"{sorted(_ARCHES)}); use the docker backend on this machine"
        )
    arch, numbers = _ARCHES[machine]
    denied = sorted(numbers.values())
    checks = [(_JGE_K, _X32_BIT)] if machine == "x86_64" else []
    checks += [(_JEQ_K, nr) for nr in denied]
    # Layout: load arch; foreign arch -> deny; load nr; one check per entry; allow; deny.
    program = [_insn(_LD_ABS_W, _ARCH), _insn(_JEQ_K, arch, jt=0, jf=len(checks) + 2)]
    program.append(_insn(_LD_ABS_W, _NR))
    for i, (code, k) in enumerate(checks):
        program.append(_insn(code, k, jt=len(checks) - i, jf=0))  # jt lands on the deny
    program += [_insn(_RET_K, _RET_ALLOW), _insn(_RET_K, _RET_EPERM)]
    return b"".join(program)


@functools.cache
def program() -> bytes:
    """The filter for this machine, built once."""
    return build(platform.machine())


def pipe() -> int:
    """A pipe's read end holding the filter, for one bwrap (``--seccomp FD``); the caller
    closes it once bwrap has started."""
    read, write = os.pipe()
    try:
        os.write(write, program())  # a few hundred bytes: far below the pipe's buffer
    finally:
        os.close(write)
    return read


def docker_profile() -> str:
    """The same deny-list as a Docker seccomp profile (JSON, for ``--security-opt seccomp=``).

    Docker's own default profile lets io_uring and ptrace through on some engine versions; this
    one denies them everywhere. Creating a user namespace is denied too (``clone`` with
    CLONE_NEWUSER; ``clone3``, whose flags a filter cannot read, answers ENOSYS so that libc
    falls back to ``clone``). Other namespaces and mounts need capabilities the container lacks.
    """
    clone_newuser = 0x10000000
    rules = [
        {"names": sorted(DENIED), "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
        {
            "names": ["clone"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": 1,
            "args": [
                {
                    "index": 0,
                    "value": clone_newuser,
                    "valueTwo": clone_newuser,
                    "op": "SCMP_CMP_MASKED_EQ",
                }
            ],
        },
    ]
    return json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": rules})
