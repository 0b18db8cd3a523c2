#!/usr/bin/env python3
"""The SASS budget of the GPU kernel's lap (issue 24, item 4a).

Reads `nvdisasm -c` output of the nq_count kernel and finds its hot loop: the
innermost loop closed by an unconditional backward BRA whose body holds the
lap's signature (a POPC, one LDS.64 of the table entry, one LDS.128 of the
stack top). It then walks the loop's common path, from the loop head to the
backward branch, skipping the refill block: at a conditional forward branch it
takes the side that does not fetch a task (the refill is the only code with an
ATOMG), which is the path a lane takes in every lap but the rare one after its
task ended.

Prints the instructions per lap by class and FAILS (exit 1) when
  * the lap has more instructions than the budget (--budget), or
  * the lap holds a convergence barrier (BSSY, BSYNC, WARPSYNC, BAR) other
    than the single BSSY/BSYNC pair of the refill guard, or any branch other
    than the guard and the backward branch (a divergent path inside the lap).

    python3 .ci/sass-lap.py --budget 44 kernel.sass
"""

import argparse
import re
import sys

INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P[0-9T]+\s+)?([A-Z0-9_.]+)(.*?);")
LABEL = re.compile(r"^(\.L_x_\d+):")
TARGET = re.compile(r"`\((\.L_x_\d+)\)")
BARRIERS = ("BSSY", "BSYNC", "WARPSYNC", "BAR")


def parse(text):
    """Instructions as (address, predicate, opcode, operands), and labels."""
    insns, labels = [], {}
    for line in text.splitlines():
        m = LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = len(insns)
            continue
        m = INSN.match(line)
        if m:
            insns.append((int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4)))
    return insns, labels


def loops(insns, labels):
    """(head, back) index pairs of every unconditional backward BRA."""
    out = []
    for i, (_, pred, op, rest) in enumerate(insns):
        if op == "BRA" and not pred:
            t = TARGET.search(rest)
            if t and t.group(1) in labels and labels[t.group(1)] < i:
                out.append((labels[t.group(1)], i))
    return out


def signature(body):
    ops = [op for _, _, op, _ in body]
    return (
        sum(op == "POPC" for op in ops) >= 1
        and any(op.startswith("LDS.64") for op in ops)
        and any(op.startswith("LDS.128") for op in ops)
    )


class LapError(Exception):
    """The lap cannot be walked: an unresolved or backward branch inside it."""


def common_path(insns, labels, head, back):
    """The instructions a lane runs in a lap with no refill."""
    path, guards, i = [], [], head
    while i <= back:
        addr, pred, op, rest = insns[i]
        path.append(insns[i])
        if op == "BRA" and i == back:
            break
        if op == "BRA" and pred:
            t = TARGET.search(rest)
            target = labels.get(t.group(1)) if t else None
            if target is None:
                raise LapError(f"unresolved branch at {addr:#x}")
            if head <= target <= back and target > i:
                skipped = insns[i + 1 : target]
                if any(o.startswith("ATOM") for _, _, o, _ in skipped):
                    # The refill block: the lap skips it.
                    guards.append(insns[i])
                    i = target
                    continue
            elif not (head <= target <= back):
                # An out-of-line block (the refill placed after the loop).
                guards.append(insns[i])
            else:
                raise LapError(f"a backward conditional branch at {addr:#x} inside the lap")
        i += 1
    return path, guards


CLASSES = [
    ("shared memory", lambda op: op.startswith(("LDS", "STS"))),
    ("popcount", lambda op: op.startswith("POPC")),
    ("integer ALU", lambda op: op.startswith(("LOP3", "SHF", "IADD3", "ISETP", "SEL", "PLOP3", "LEA", "VIADD", "MOV", "IABS", "FLO", "UIADD3", "ULEA", "UMOV"))),
    ("IMAD (FMA pipe)", lambda op: op.startswith("IMAD")),
    ("special registers", lambda op: op.startswith(("S2R", "S2UR", "CS2R", "LDC", "ULDC"))),
    ("control and barriers", lambda op: op.startswith(("BRA", "BSSY", "BSYNC", "WARPSYNC", "BAR", "YIELD", "NOP"))),
]


def classify(op):
    for name, test in CLASSES:
        if test(op):
            return name
    return "other"


# A lap as ptxas lays it out (guard, refill block with the task fetch, join,
# lap body, backward branch), for --self-test. {extra} goes inside the body.
SYNTHETIC = """
.L_x_9:
        /*0000*/                   ISETP.NE.AND P0, PT, R7, RZ, PT ;
        /*0010*/                   BSSY B0, `(.L_x_0) ;
        /*0020*/               @P0 BRA `(.L_x_1) ;
        /*0030*/                   ATOMG.E.ADD.STRONG.GPU PT, R9, desc[UR4][R8.64], R15 ;
        /*0040*/                   LDG.E R4, desc[UR4][R2.64] ;
.L_x_1:
        /*0050*/                   BSYNC B0 ;
.L_x_0:
        /*0060*/                   LDS.128 R12, [R10] ;
        /*0070*/                   POPC R19, R24 ;
        /*0080*/                   LDS.64 R20, [R21] ;
{extra}
        /*0090*/                   POPC R10, R27 ;
        /*00a0*/               @P2 STS.128 [R12], R24 ;
        /*00b0*/                   BRA `(.L_x_9) ;
"""


def self_test():
    """The check passes a clean lap and fails each planted fault."""
    import contextlib
    import io
    import tempfile

    cases = [
        ("", 20, 0),
        ("", 9, 1),  # over the budget
        ("        /*0085*/                   BSSY B1, `(.L_x_0) ;", 20, 1),
        ("        /*0085*/                   WARPSYNC 0xffffffff ;", 20, 1),
        ("        /*0085*/               @P3 BRA `(.L_x_0) ;", 20, 1),
        ("        /*0085*/               @P3 BRA `(.L_x_7) ;\n.L_x_7:", 20, 1),
    ]
    for extra, budget, want in cases:
        with tempfile.NamedTemporaryFile("w", suffix=".sass", delete=False) as f:
            f.write(SYNTHETIC.format(extra=extra))
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            got = run(["--budget", str(budget), "--label", "self-test: ", f.name])
        if got != want:
            print(f"sass-lap: self-test case {extra!r} budget {budget}: exit {got}, want {want}", file=sys.stderr)
            return 1
    print("   sass-lap self-test: a clean lap passes; over budget, BSSY, WARPSYNC and branches in the lap fail")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    return run(sys.argv[1:])


def run(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--budget", type=int, required=True, help="most SASS instructions per lap")
    ap.add_argument("--label", default="", help="what was compiled, for the printout")
    ap.add_argument("sass", help="nvdisasm -c output")
    args = ap.parse_args(argv)
    insns, labels = parse(open(args.sass).read())
    candidates = [(h, b) for h, b in loops(insns, labels) if signature(insns[h : b + 1])]
    if not candidates:
        print("sass-lap: no loop with the lap's signature (POPC, LDS.64, LDS.128)", file=sys.stderr)
        return 1
    head, back = min(candidates, key=lambda hb: hb[1] - hb[0])
    try:
        path, guards = common_path(insns, labels, head, back)
    except LapError as e:
        print(f"sass-lap: {e}", file=sys.stderr)
        return 1
    by_class = {}
    for _, _, op, _ in path:
        by_class[classify(op)] = by_class.get(classify(op), 0) + 1
    barriers = [(a, op) for a, _, op, _ in path if op.startswith(BARRIERS)]
    branches = [(a, op) for a, p, op, _ in path if op == "BRA" and p]
    lap = len(path)
    print(
        f"   {args.label}lap = {lap} SASS instructions (budget {args.budget}): "
        + ", ".join(f"{n} {by_class[n]}" for n, _ in CLASSES + [("other", None)] if n in by_class)
    )
    print(
        f"   {args.label}refill guard: {len(guards)} conditional branch(es), "
        f"barriers on the lap's path: {' '.join(op for _, op in barriers) or 'none'}"
    )
    failed = False
    if lap > args.budget:
        print(f"sass-lap: the lap has {lap} instructions, over the budget of {args.budget}", file=sys.stderr)
        failed = True
    # The guard may cost one BSSY and one BSYNC (the refill block's join);
    # anything more is a convergence barrier inside the lap.
    kinds = [op.split(".")[0] for _, op in barriers]
    if kinds.count("BSSY") > 1 or kinds.count("BSYNC") > 1 or any(
        k in ("WARPSYNC", "BAR") for k in kinds
    ):
        print(f"sass-lap: convergence barriers inside the lap: {barriers}", file=sys.stderr)
        failed = True
    if len(branches) > len(guards):
        print(f"sass-lap: divergent branches inside the lap: {branches}", file=sys.stderr)
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
