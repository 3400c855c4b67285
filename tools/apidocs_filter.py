#!/usr/bin/env python3
"""Doxygen's INPUT_FILTER for lockstep's headers (docs/Doxyfile, tools/apidocs.sh).

lockstep documents declarations Google style, with plain `//` comments, which Doxygen ignores.
This filter rewrites a header as Doxygen reads it (never the file on disk: it prints to stdout):

  * a run of `//` lines directly above a declaration becomes `///` lines: the declaration's
    documentation. Directly above means the next line is code: not a blank line, `#include`,
    `#else`, `#endif`, `}` or an access specifier (an `#if` is code: the comment documents what
    the conditional declares). A run followed by a blank line (a `// Note [...]` block, a
    section heading) is left as it is.
  * a trailing `  // text` after a member, an enum value or a declaration (code ending in `;`,
    `,` or an inline body's `}`), and the `//` lines continuing it in the same column, become
    `///<`: the documentation of what precedes it.
  * the file's opening comment (from line 1, `// pkg/name.h` then the overview) becomes the
    file's documentation, `/// \\file`.
  * in those comments, a run of lines indented by 3 or more after a line ending in ':' (an
    example, a layout) becomes a code block, and elsewhere a backslash, @, < or & is escaped, so
    that the text reads as written.

Only comments at namespace, class, struct and enum scope are rewritten, never those inside a
function body. Every line keeps its number, so Doxygen's warnings point at the real file:line.

Usage: apidocs_filter.py HEADER  (what Doxygen runs for each input file)
"""

import re
import sys

_DECL_KEYWORD = re.compile(r"\b(namespace|class|struct|union|enum|extern)\b")
_SKIP_NEXT = re.compile(r"^(#\s*(include|elif|else|endif|pragma|undef)\b|\}|"
                        r"(public|protected|private)\s*:)")
_TOOL_COMMENT = re.compile(r"^//\s*(NOLINT|clang-format|IWYU)")


def split_code_comment(line, in_block):
    """Returns (code with literals and comments blanked, column of a `//` comment or -1,
    whether a /* */ comment is still open at the end of the line)."""
    code = []
    i, n = 0, len(line)
    while i < n:
        if in_block:
            end = line.find("*/", i)
            if end < 0:
                return "".join(code), -1, True
            i, in_block = end + 2, False
            code.append(" ")
            continue
        c = line[i]
        if line.startswith("//", i):
            return "".join(code), i, False
        if line.startswith("/*", i):
            in_block, i = True, i + 2
            continue
        if c in "\"'":
            j = i + 1
            while j < n and line[j] != c:
                j += 2 if line[j] == "\\" else 1
            code.append(c + c)  # the literal, emptied
            i = j + 1
            continue
        code.append(c)
        i += 1
    return "".join(code), -1, in_block


def scan(lines):
    """Per line: (code, comment column, whether the line starts at declaration scope)."""
    info = []
    stack = []  # per open brace: True for namespace, class, struct, union, enum, extern "C"
    statement = ""  # code since the last ; { or }
    in_block = False
    for line in lines:
        at_decl_scope = all(stack)
        code, col, in_block = split_code_comment(line, in_block)
        info.append((code, col, at_decl_scope))
        for c in code:
            if c == "{":
                head = statement
                stack.append(bool(_DECL_KEYWORD.search(head)) and "(" not in head and
                             "=" not in head)
                statement = ""
            elif c == "}":
                if stack:
                    stack.pop()
                statement = ""
            elif c == ";":
                statement = ""
            else:
                statement += c
        if code.lstrip().startswith("#"):
            statement = ""  # a preprocessor line is not part of the next declaration
    return info


def is_comment_only(line):
    return line.lstrip().startswith("//")


def documents_what_precedes(code):
    code = code.strip()
    if not code or code.startswith("}") or code.startswith("#"):
        return False
    return code.endswith((";", ",", "}")) or re.fullmatch(r"[A-Za-z_]\w*(\s*=.*)?", code)


def escape(text):
    """Makes prose literal for Doxygen: a backslash, @, < or & outside `code spans` and "quoted
    text" (which Doxygen already takes literally) is escaped, so that it stays as written instead
    of starting a command, an HTML tag or an entity."""
    parts = re.split(r'(`[^`]*`|"[^"]*")', text)
    for k in range(0, len(parts), 2):  # the text between spans and quotes
        parts[k] = re.sub(r"([\\@<&])", r"\\\1", parts[k])
    return "".join(parts)


def doc_block(lines, marker):
    r"""Rewrites a block of `//` lines as Doxygen's `marker` lines (`///` or `///<`), with a run
    of lines indented by 3 or more after a line ending in ':' (an example, a layout) as a code
    block: `\code` ends the line before it and `\endcode` its last line."""
    texts = []
    for line in lines:
        col = line.index("//")
        texts.append((line[:col], line[col + 2:]))
    out = []
    k = 0
    while k < len(texts):
        indent, text = texts[k]
        out.append(indent + marker + escape(text))
        starts_code = (text.rstrip().endswith(":") and not re.match(r"\s*[-*] |\s*\d+\. ", text) and
                       k + 1 < len(texts) and re.match(r"   +\S", texts[k + 1][1]))
        if not starts_code:
            k += 1
            continue
        out[-1] += " \\code"
        k += 1
        last = k
        while k < len(texts) and (re.match(r"   +\S", texts[k][1]) or
                                  (not texts[k][1].strip() and k + 1 < len(texts) and
                                   re.match(r"   +\S", texts[k + 1][1]))):
            indent, text = texts[k]
            out.append(indent + marker + text)  # code: as it is
            last = k
            k += 1
        out[last] += " \\endcode"
    return out


def filter_header(text):
    lines = text.split("\n")
    info = scan(lines)
    out = list(lines)
    n = len(lines)

    # Trailing comments, and the comment lines continuing one in its column.
    continuation = set()
    for i, line in enumerate(lines):
        code, col, at_decl_scope = info[i]
        if col < 0 or not code.strip() or not at_decl_scope:
            continue
        if not documents_what_precedes(code) or line.startswith("///", col):
            continue
        j = i + 1
        while j < n and is_comment_only(lines[j]) and lines[j].index("//") == col:
            continuation.add(j)
            j += 1
        block = doc_block([" " * col + line[col:]] + lines[i + 1:j], "///<")
        out[i] = line[:col] + block[0][col:]
        out[i + 1:j] = block[1:]

    # Runs of comment lines.
    i = 0
    while i < n:
        if (not is_comment_only(lines[i]) or i in continuation or
                _TOOL_COMMENT.match(lines[i].lstrip())):
            i += 1
            continue
        start = i
        while (i < n and is_comment_only(lines[i]) and i not in continuation and
               not _TOOL_COMMENT.match(lines[i].lstrip())):
            i += 1
        end = i  # the run is lines[start:end]
        if any(lines[k].lstrip().startswith("///") for k in range(start, end)):
            continue  # already Doxygen's
        first = re.fullmatch(r"//\s*\S+\.h\b\s*(.*)", lines[0])
        if start == 0 and first:
            out[0] = "/// \\file"
            out[1:end] = doc_block(lines[1:end], "///")
            if first.group(1) and end > 1 and lines[1].strip() == "//":
                out[1] = "/// " + escape(first.group(1))  # "(--config=cuda)" after the path
            continue
        following = lines[end].strip() if end < n else ""
        if not following or _SKIP_NEXT.match(following) or not info[end][2]:
            continue
        out[start:end] = doc_block(lines[start:end], "///")
    return "\n".join(out)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: apidocs_filter.py HEADER")
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write(filter_header(f.read()))


if __name__ == "__main__":
    main()
