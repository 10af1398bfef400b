"""Text a user controls (a process name, a command line, a cgroup path), made safe to print.

A comm or a cgroup directory name may hold a newline, a carriage return or a terminal escape
sequence: printed raw, it can hide or forge lines in a plan a reviewer reads, and it breaks the
TOML diagnose writes. ``printable`` escapes every character Python calls unprintable: the control
characters (C0, DEL, C1) and the Unicode format characters that reorder or hide text
(bidirectional overrides, zero-width marks), and separators other than the space.
"""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` with each control or format character but the tab written as an escape (``\\n``, ``\\x1b``, ``\\u202e``)."""
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char.isprintable() or char in " \t":  # a tab moves the cursor along its line only
            out.append(char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif ord(char) < 0x100:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(f"\\u{ord(char):04x}" if ord(char) < 0x10000 else f"\\U{ord(char):08x}")
    return "".join(out)

