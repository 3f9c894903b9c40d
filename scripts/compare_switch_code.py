"""Compares the compression switch's code in two libmxnet.so files by disassembly.

Usage: python scripts/compare_switch_code.py CPU_LIBMXNET CANDIDATE_LIBMXNET

kvstore_ext/compression_switch.py reaches MXNet's GradientCompression through
fixed offsets: the KVStore holds its GradientCompression* at byte 80, which holds
``type_`` at 8 and ``threshold_`` at 12.  Those offsets are compiled into the
functions below.  A candidate build is the same for the switch when each function
has the same instructions as in the CPU wheel (addresses of calls, jumps and
rip-relative data aside, which differ with the library's size) and the offsets
appear where the switch expects them.  Prints one line per function and a last
line ``same`` or ``differs: ...``; exits 0 only for ``same``.  Needs binutils
(nm, objdump).
"""
import re
import subprocess
import sys

# demangled name prefix -> instruction text each must contain (the switch's offsets)
FUNCTIONS = {
    "MXKVStoreSetGradientCompression": [],
    "mxnet::kvstore::KVStoreDist::SetGradientCompression(": ["0x50(%"],
    "mxnet::kvstore::GradientCompression::GradientCompression()": [],
    "mxnet::kvstore::GradientCompression::get_type()": ["mov    0x8(%rdi),%eax"],
    "mxnet::kvstore::GradientCompression::SetTwoBitCompression(float)": ["0xc(%rdi)"],
}


def symbols(lib):
    """{demangled name: (address, size)} of the functions above (dynamic symbols)."""
    out = subprocess.run(["nm", "-D", "-C", "-S", "--defined-only", lib], check=True,
                         capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 4:
            continue
        address, size, _, name = parts
        for prefix in FUNCTIONS:
            if name.startswith(prefix) and prefix not in found:
                found[prefix] = (int(address, 16), int(size, 16))
    return found


def instructions(lib, address, size):
    """The function's instructions, with addresses that depend on the layout masked."""
    out = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", "--start-address=%#x" % address,
         "--stop-address=%#x" % (address + size), lib],
        check=True, capture_output=True, text=True).stdout
    code = []
    for line in out.splitlines():
        match = re.match(r"\s+[0-9a-f]+:\s+(.*)$", line)
        if not match:
            continue
        text = re.sub(r"\s+#.*$", "", match.group(1))          # objdump's comments
        text = re.sub(r"<[^>]*>", "", text)                     # symbol names
        text = re.sub(r"-?0x[0-9a-f]+\(%rip\)", "REL(%rip)", text)
        if re.match(r"(call|jmp|j[a-z]+)\s", text):
            text = re.sub(r"\b[0-9a-f]{4,}\b", "TARGET", text)
        code.append(text.strip())
    return code


def compare(cpu_lib, candidate_lib, stream=sys.stdout):
    """Print the comparison; return the list of problems (empty: same)."""
    problems = []
    cpu_syms, cand_syms = symbols(cpu_lib), symbols(candidate_lib)
    for prefix, needles in FUNCTIONS.items():
        if prefix not in cpu_syms or prefix not in cand_syms:
            problems.append("%s not found" % prefix)
            print("  %-66s missing" % prefix, file=stream)
            continue
        cpu_code = instructions(cpu_lib, *cpu_syms[prefix])
        cand_code = instructions(candidate_lib, *cand_syms[prefix])
        missing = [n for n in needles if not any(n in i for i in cand_code)]
        same = cpu_code == cand_code and cpu_code
        print("  %-66s %d instructions, %s%s" % (
            prefix, len(cand_code), "identical" if same else "DIFFERENT",
            "".join(", offset %r present" % n for n in needles if n not in missing)),
            file=stream)
        if not same:
            problems.append("%s: instructions differ from the CPU wheel's" % prefix)
        problems += ["%s: no %r" % (prefix, n) for n in missing]
    print("same" if not problems else "differs: " + "; ".join(problems), file=stream)
    return problems


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(1 if compare(sys.argv[1], sys.argv[2]) else 0)
