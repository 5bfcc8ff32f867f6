"""The command-policy floor: hardline rules nothing can switch off, then an admin's block/warn rules."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import tree_sitter_bash
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from tree_sitter import Language, Node, Parser

from .chokepoint.base import BaseTool
from .chokepoint.policy import DENY, NO_COMMAND_RULES, CommandRules, CompiledPolicy, Decision
from .models import COMMAND_RULE_NAME, CommandRule
from .policy_toml import PolicyFileError, Section, section_register

BASH = Language(tree_sitter_bash.language())
SHELL_LANGUAGES = frozenset({"bash", "sh"})
MAX_DEPTH = 8
MAX_SCRIPT_CHARS = 1_000_000

HARDLINE = {
    "parse_error": "The command does not parse as shell, so the floor cannot see what it would run.",
    "too_deep": f"The command nests shells inside shells more than {MAX_DEPTH} deep.",
    "non_literal_command": "A command name comes from an expansion or a pattern, so the floor cannot see what runs.",
    "dynamic_shell_code": "Code handed to a shell, eval or trap is not a literal, so the floor cannot read it.",
    "rm_critical": "A recursive rm of /, a top-level system directory or the home directory.",
    "find_delete_critical": "find deleting from /, a top-level system directory or the home directory.",
    "chmod_critical": "A recursive chmod/chown of /, a top-level system directory or the home directory.",
    "format_disk": "Formatting or wiping a filesystem or disk.",
    "raw_disk_write": "Writing straight to a disk device.",
    "power_off": "Shutting down, rebooting or halting the machine.",
    "kill_all": "Signalling every process (kill -1).",
    "fork_bomb": "A function that calls itself in a pipeline or in the background: a fork bomb.",
    "download_to_shell": "Something downloaded piped straight into a shell or interpreter.",
    "decode_to_shell": "Decoded or unescaped text piped straight into a shell or interpreter.",
}

CRITICAL_DIRS = frozenset(
    "/ /bin /boot /dev /etc /home /lib /lib32 /lib64 /libx32 /media /mnt /opt /proc /root /run /sbin /snap /srv "
    "/sys /usr /var".split()
)
HOME = "/\x00home"  # what ~ and $HOME normalise to: no real path can equal it
DEVICE = re.compile(
    r"^/dev/(sd[a-z]+\d*|hd[a-z]+\d*|vd[a-z]+\d*|xvd[a-z]+\d*|nvme\d+n\d+(p\d+)?|mmcblk\d+(p\d+)?|md\d+|dm-\d+"
    r"|loop\d+|sr\d+|nbd\d+|zram\d+|mapper/.+|disk/.+|root|mem|kmem|port)$"
)
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "posh", "fish", "rbash"})
# Interpreters that run a program read from standard input unless told otherwise, and the flags that say otherwise.
INTERPRETERS = {
    "python": {"-c", "-m"},
    "python2": {"-c", "-m"},
    "python3": {"-c", "-m"},
    "perl": {"-e", "-E"},
    "ruby": {"-e"},
    "node": {"-e", "-p", "--eval", "--print"},
    "nodejs": {"-e", "-p", "--eval", "--print"},
    "php": {"-r"},
    "lua": {"-e"},
}
DOWNLOADERS = frozenset(
    "curl wget fetch aria2c lynx links w3m http https xh nc ncat netcat socat telnet ftp tftp ssh".split()
)
DECODERS = frozenset(
    "base64 base32 basenc xxd uudecode openssl gzip gunzip zcat bzip2 bunzip2 bzcat xz unxz xzcat zstd unzstd "
    "zstdcat lz4 lz4cat rev tr printf".split()
)
FORMATTERS = frozenset({"mke2fs", "mkdosfs", "mkntfs", "mkexfatfs", "wipefs", "blkdiscard"})
POWER = frozenset({"shutdown", "reboot", "poweroff", "halt", "kexec"})
SYSTEMCTL_POWER = frozenset(
    {"poweroff", "reboot", "halt", "kexec", "suspend", "hibernate", "hybrid-sleep", "suspend-then-hibernate"}
)
DELETERS = frozenset({"rm", "shred", "unlink", "rmdir"})
DEVICE_WRITERS = frozenset({"tee", "cp", "mv", "install", "shred", "ddrescue", "truncate"})
WRITE_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", ">&", "<>"})


@dataclass(frozen=True)
class Rule:
    name: str
    reason: str


@dataclass(frozen=True)
class Verdict:
    blocked: Rule | None
    warnings: tuple[Rule, ...] = ()


class Blocked(Exception):
    def __init__(self, name: str, detail: str = ""):
        super().__init__(name)
        reason = HARDLINE[name]
        self.rule = Rule(name, f"{reason} ({detail})" if detail else reason)


# -- words: what a node means once quotes, escapes and expansions are accounted for --------------------------------


@dataclass(frozen=True)
class Word:
    text: str  # quotes and escapes decoded; expansions kept as written ($HOME)
    bare: str  # the same with every expansion left empty
    expanded: bool  # contains a parameter, command or arithmetic expansion
    pattern: bool  # contains an unquoted glob or brace expansion

    @property
    def literal(self) -> bool:
        return not self.expanded and not self.pattern


def _literal_word(text: str) -> Word:
    return Word(text, text, False, False)


BRACE = re.compile(r"\{[^{}]*(,|\.\.)[^{}]*\}")
C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "e": "\x1b", "E": "\x1b"}
C_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{1,2}|u[0-9a-fA-F]{1,4}|U[0-9a-fA-F]{1,8}|[0-7]{1,3}|c.|.)", re.S)


def _ansi_c(body: str) -> str:
    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        if code[0] in "xuU":
            return chr(int(code[1:], 16)) if int(code[1:], 16) < 0x110000 else ""
        if code[0] in "01234567":
            return chr(int(code, 8) & 0xFF)
        if code[0] == "c":
            return chr(ord(code[1]) & 0x1F)
        return C_ESCAPES.get(code, code)

    return C_ESCAPE.sub(one, body)


def _unquoted(raw: str) -> tuple[str, bool]:
    """Decode backslashes of an unquoted word; report whether an unescaped glob or brace expansion remains."""
    out, plain, i = [], [], 0
    while i < len(raw):
        char = raw[i]
        if char == "\\" and i + 1 < len(raw):
            if raw[i + 1] != "\n":
                out.append(raw[i + 1])
                plain.append("_")
            i += 2
            continue
        out.append(char)
        plain.append(char)
        i += 1
    unescaped = "".join(plain)
    return "".join(out), bool(re.search(r"[*?\[]", unescaped) or BRACE.search(unescaped))


def _in_double_quotes(raw: str) -> str:
    return re.sub(r"\\([\\\"$`\n])", lambda m: "" if m.group(1) == "\n" else m.group(1), raw)


def word(node: Node) -> Word:
    kind = node.type
    text = node.text.decode(errors="replace")
    if kind == "word":
        decoded, pattern = _unquoted(text)
        return Word(decoded, decoded, False, pattern)
    if kind == "number":
        return _literal_word(text)
    if kind == "raw_string":
        return _literal_word(text[1:-1])
    if kind == "ansi_c_string":
        return _literal_word(_ansi_c(text[2:-1]))
    if kind in ("string", "translated_string"):
        parts = [word(child) for child in node.named_children]
        return Word(
            "".join(p.text for p in parts),
            "".join(p.bare for p in parts),
            any(p.expanded for p in parts),
            False,
        )
    if kind == "string_content":
        return _literal_word(_in_double_quotes(text))
    if kind == "concatenation":
        parts = [word(child) for child in node.children]
        return Word(
            "".join(p.text for p in parts),
            "".join(p.bare for p in parts),
            any(p.expanded for p in parts),
            any(p.pattern for p in parts),
        )
    if kind == "expansion" and [c.type for c in node.named_children] == ["variable_name"]:
        return Word("$" + node.named_children[0].text.decode(), "", True, False)
    return Word(text, "", True, kind not in ("simple_expansion", "expansion"))


def _basename(text: str) -> str:
    return text.rstrip("/").rsplit("/", 1)[-1] if text.strip("/") else text


def _critical(target: Word) -> bool:
    """Is this operand /, a top-level system directory or home, as written or with its variables empty?"""
    for text in {target.text, target.bare}:
        if not text:
            continue
        for home in ("~", "$HOME"):
            if text == home or text.startswith(home + "/"):
                text = HOME + text[len(home) :]
        path = re.sub(r"/+", "/", text)
        while re.search(r"/(\*|\.\*|\*\*)$", path):
            path = path.rsplit("/", 1)[0] or "/"
        path = posixpath.normpath(path) if path.startswith("/") else path
        if path in CRITICAL_DIRS or path == HOME:
            return True
    return False


def _device(target: str) -> bool:
    return bool(DEVICE.match(posixpath.normpath(re.sub(r"/+", "/", target)))) if target.startswith("/") else False


# -- wrappers: commands that run the rest of their arguments as a command -------------------------------------------


@dataclass(frozen=True)
class Wrapper:
    values: frozenset[str] = frozenset()  # options that take the next argument as their value
    operands: int = 0  # operands before the wrapped command (timeout's DURATION, chroot's NEWROOT)


def _wrapper(values: str = "", operands: int = 0) -> Wrapper:
    return Wrapper(frozenset(values.split()), operands)


WRAPPERS = {
    "sudo": _wrapper(
        "-u -g -h -p -C -r -t -D -U -T --user --group --host --prompt --close-from --role --type --chdir "
        "--other-user --command-timeout"
    ),
    "doas": _wrapper("-u -C"),
    "pkexec": _wrapper("--user"),
    "builtin": _wrapper(),
    "exec": _wrapper("-a"),
    "nohup": _wrapper(),
    "nice": _wrapper("-n --adjustment"),
    "ionice": _wrapper("-c -n -p -P -u --class --classdata --pid --pgid --uid"),
    "timeout": _wrapper("-s -k --signal --kill-after", operands=1),
    "stdbuf": _wrapper("-i -o -e --input --output --error"),
    "time": _wrapper("-f -o --format --output"),
    "setsid": _wrapper(),
    "xargs": _wrapper(
        "-a -d -E -I -L -n -P -s --arg-file --delimiter --eof --replace --max-lines --max-args --max-procs "
        "--max-chars --process-slot-var"
    ),
    "chroot": _wrapper("--userspec --groups", operands=1),
    "chrt": _wrapper(operands=1),
    "taskset": _wrapper(operands=1),
    "faketime": _wrapper("-f", operands=1),
    "busybox": _wrapper(),
    "coproc": _wrapper(),
    "strace": _wrapper("-o -e -p -s -u -E -P -a -b -I -S -X -O"),
    "ltrace": _wrapper("-o -e -p -s -u -E -a -n"),
    "unbuffer": _wrapper(),
    "prlimit": _wrapper("-p --pid"),
    "unshare": _wrapper("-S -G --setuid --setgid --wd --root"),
    "nsenter": _wrapper("-t -S -G --target --setuid --setgid --wd --root"),
    "setpriv": _wrapper("--reuid --regid --ruid --rgid --euid --egid --groups --securebits --selinux-label"),
    "systemd-run": _wrapper("-p -u -E -M -H --unit --property --setenv --machine --host --description --slice"),
    "runuser": _wrapper("-u -g -G --user --group --supp-group"),
    "firejail": _wrapper(),
    "proxychains": _wrapper("-f"),
    "proxychains4": _wrapper("-f"),
    "torsocks": _wrapper(),
    "catchsegv": _wrapper(),
    "valgrind": _wrapper(),
    "flatpak-spawn": _wrapper(),
}
# Commands that take a command as one string, and the options that carry it.
STRING_RUNNERS = {"su": {"-c", "--command"}, "runuser": {"-c", "--command"}, "script": {"-c", "--command"}}


def _skip_options(args: list[Word], spec: Wrapper) -> list[Word]:
    """The wrapped command and its arguments: past the wrapper's options and leading operands."""
    i, operands = 0, spec.operands
    while i < len(args):
        text = args[i].text
        if text == "--":
            i += 1
            break
        if text.startswith("-") and len(text) > 1 and args[i].literal:
            i += 2 if text in spec.values else 1
            continue
        if operands:
            operands -= 1
            i += 1
            continue
        break
    while operands and i < len(args):
        operands -= 1
        i += 1
    return args[i:]


# -- the analysis -----------------------------------------------------------------------------------------------------


class Analysis:
    """Walks a script and everything it would run; raises Blocked at the first hardline rule it meets."""

    def __init__(self) -> None:
        self.parser = Parser(BASH)
        self.commands: list[str] = []  # each simple command normalised, for the admin's regex rules

    def script(self, text: str, depth: int = 0) -> None:
        if depth > MAX_DEPTH:
            raise Blocked("too_deep")
        if "\x00" in text:
            raise Blocked("parse_error", "a NUL byte")
        tree = self.parser.parse(text.encode())
        if tree.root_node.has_error:
            raise Blocked("parse_error", _first_error(tree.root_node))
        for node in _nodes(tree.root_node):
            handler = self.HANDLERS.get(node.type)
            if handler is not None:
                handler(self, node, depth)

    # -- node handlers --

    def command(self, node: Node, depth: int) -> None:
        name = node.child_by_field_name("name")
        if name is None:
            return
        args = [word(child) for child in node.children_by_field_name("argument")]
        name_word = word(name.named_children[0]) if name.named_children else word(name)
        redirects = list(node.children_by_field_name("redirect"))
        parent = node.parent
        if parent is not None and parent.type == "redirected_statement" and parent.child_by_field_name("body") == node:
            redirects += parent.children_by_field_name("redirect")
        self.simple(name_word, args, depth, stdin_code=_stdin_code(redirects))

    def redirect(self, node: Node, depth: int) -> None:
        operator = next((c.type for c in node.children if c.type in WRITE_REDIRECTS), None)
        destination = node.child_by_field_name("destination")
        if operator is not None and destination is not None and _device(word(destination).text):
            raise Blocked("raw_disk_write", f"redirect to {word(destination).text}")

    def pipeline(self, node: Node, depth: int) -> None:
        stages = [_stage(child) for child in node.named_children if child.type in ("command", "redirected_statement")]
        for index, stage in enumerate(stages):
            if stage is None or not _reads_program_from_stdin(*stage):
                continue
            for earlier in stages[:index]:
                if earlier is None:
                    continue
                source, source_args = earlier
                if source in DOWNLOADERS:
                    raise Blocked("download_to_shell", f"{source} | {stage[0]}")
                if _decodes(source, source_args):
                    raise Blocked("decode_to_shell", f"{source} | {stage[0]}")
            previous = stages[index - 1] if index else None
            shell_reads_it = stage[0] in SHELLS and previous is not None and previous[0] in ("echo", "printf")
            if shell_reads_it and all(a.literal for a in previous[1]):
                self.script(" ".join(a.text for a in previous[1] if a.text != "-n"), depth + 1)

    def function(self, node: Node, depth: int) -> None:
        name_node = node.child_by_field_name("name")
        body = node.child_by_field_name("body")
        if name_node is None or body is None:
            return
        name = word(name_node).text
        calls = [n for n in _nodes(body) if n.type == "command" and _command_name(n) == name]
        if not calls:
            return
        backgrounded = any(n.type == "&" for n in _nodes(body))
        piped = any(_inside(call, "pipeline", body) for call in calls)
        if backgrounded or piped:
            raise Blocked("fork_bomb", f"function {name}")

    HANDLERS: dict[str, Callable[[Analysis, Node, int], None]] = {
        "command": command,
        "file_redirect": redirect,
        "pipeline": pipeline,
        "function_definition": function,
    }

    # -- simple commands --

    def simple(
        self,
        name: Word,
        args: list[Word],
        depth: int,
        *,
        stdin_code: Word | None = None,
    ) -> None:
        if not name.literal:
            raise Blocked("non_literal_command", name.text[:80])
        base = _basename(name.text)
        self.commands.append(" ".join([base, *(a.text for a in args)]))
        if stdin_code is not None and base in SHELLS and _reads_program_from_stdin(base, args):
            self._code(stdin_code, depth, base)
        self._rules(base, args, depth, stdin_code)
        for index, arg in enumerate(args):
            if arg.literal and _basename(arg.text) in ARGUMENT_RULES:
                ARGUMENT_RULES[_basename(arg.text)](args[index + 1 :])

    def _code(self, code: Word, depth: int, runner: str) -> None:
        if not code.literal:
            raise Blocked("dynamic_shell_code", f"{runner} {code.text[:80]}")
        self.script(code.text, depth + 1)

    def _rules(self, base: str, args: list[Word], depth: int, stdin_code: Word | None) -> None:
        if base in WRAPPERS or base in ("env", "command", "watch", "flock", "find"):
            for wrapped in self._wrapped(base, args, depth):
                if wrapped:
                    self.simple(wrapped[0], wrapped[1:], depth, stdin_code=stdin_code)
        if base in STRING_RUNNERS:
            code = _option_value(args, STRING_RUNNERS[base])
            if code is not None:
                self._code(code, depth, base)
        if base in SHELLS:
            mode, code = _shell_program(args)
            if mode == "string" and code is not None:
                self._code(code, depth, base)
            if mode == "file" and code is not None and code.text.startswith(("<(", "$(")):
                raise Blocked("dynamic_shell_code", f"{base} {code.text[:80]}")
        if base in ("source", "."):
            if args and args[0].text.startswith("<("):
                raise Blocked("dynamic_shell_code", f"{base} {args[0].text[:80]}")
        if base == "eval" and args:
            self._code(_join(args), depth, "eval")
        if base == "trap" and args and args[0].text not in ("-l", "-p", "-", "--", ""):
            self._code(args[0], depth, "trap")
        if base == "alias":
            for arg in args:
                if "=" in arg.text:
                    self._code(_literal_word(arg.text.split("=", 1)[1]) if arg.literal else arg, depth, "alias")
        if base.startswith("mkfs") or base in FORMATTERS:
            raise Blocked("format_disk", base)
        if base in POWER:
            raise Blocked("power_off", base)
        if base in ("init", "telinit") and any(a.text in ("0", "6") for a in args):
            raise Blocked("power_off", f"{base} {args[0].text}")
        if base == "systemctl" and any(a.text in SYSTEMCTL_POWER for a in args):
            raise Blocked("power_off", "systemctl")
        if base == "killall5":
            raise Blocked("kill_all", base)
        rule = ARGUMENT_RULES.get(base)
        if rule is not None:
            rule(args)

    def _wrapped(self, base: str, args: list[Word], depth: int) -> Iterator[list[Word]]:
        if base == "env":
            yield from self._env(args, depth)
        elif base == "command":
            if not any(a.text.startswith("-") and ("v" in a.text or "V" in a.text) for a in args[:3]):
                yield _skip_options(args, _wrapper())
        elif base == "watch":
            rest = _skip_options(args, _wrapper("-n -d --interval --differences"))
            if any(a.text in ("-x", "--exec") for a in args):
                yield rest
            elif rest:
                self._code(_join(rest), depth, "watch")
        elif base == "flock":
            code = _option_value(args, {"-c", "--command"})
            if code is not None:
                self._code(code, depth, "flock")
            else:
                yield _skip_options(args, _wrapper("-w -E --timeout --conflict-exit-code", operands=1))
        elif base == "find":
            yield from _find(args)
        else:
            yield _skip_options(args, WRAPPERS[base])

    def _env(self, args: list[Word], depth: int) -> Iterator[list[Word]]:
        i = 0
        while i < len(args):
            text = args[i].text
            if text in ("-S", "--split-string") and i + 1 < len(args):
                self._code(_join(args[i + 1 :]), depth, "env -S")
                return
            if text.startswith("--split-string=") or (text.startswith("-S") and len(text) > 2):
                rest = [_literal_word(text.split("=", 1)[1] if "=" in text else text[2:]), *args[i + 1 :]]
                self._code(_join(rest), depth, "env -S")
                return
            if text in ("-u", "-C", "--unset", "--chdir"):
                i += 2
            elif text == "--":
                i += 1
                break
            elif (text.startswith("-") and len(text) > 1) or ("=" in text and not text.startswith("=")):
                i += 1
            else:
                break
        yield args[i:]


def _nodes(root: Node) -> Iterator[Node]:
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children))


def _first_error(root: Node) -> str:
    for node in _nodes(root):
        if node.type == "ERROR" or node.is_missing:
            return f"near {node.text.decode(errors='replace')[:40]!r}" if node.text else "unterminated"
    return "syntax error"


def _inside(node: Node, kind: str, stop: Node) -> bool:
    current = node.parent
    while current is not None and current != stop:
        if current.type == kind:
            return True
        current = current.parent
    return False


def _command_name(node: Node) -> str | None:
    name = node.child_by_field_name("name")
    if name is None:
        return None
    return word(name.named_children[0] if name.named_children else name).text


def _stage(node: Node) -> tuple[str, list[Word]] | None:
    """A pipeline stage as (basename after wrappers, arguments), or None for a compound stage."""
    if node.type == "redirected_statement":
        body = node.child_by_field_name("body")
        if body is None or body.type != "command":
            return None
        node = body
    name = node.child_by_field_name("name")
    if name is None:
        return None
    name_word = word(name.named_children[0] if name.named_children else name)
    args = [word(child) for child in node.children_by_field_name("argument")]
    base = _basename(name_word.text)
    for _ in range(MAX_DEPTH):
        if base == "env":
            args = _skip_options(args, _wrapper("-u -C --unset --chdir"))
            while args and "=" in args[0].text and not args[0].text.startswith("-"):
                args = args[1:]
        elif base in WRAPPERS:
            args = _skip_options(args, WRAPPERS[base])
        else:
            break
        if not args:
            return None
        base, args = _basename(args[0].text), args[1:]
    return base, args


def _stdin_code(redirects: list[Node]) -> Word | None:
    """What a here-string or here-document feeds the command: the program, when the command is a shell."""
    for redirect in redirects:
        if redirect.type == "herestring_redirect" and redirect.named_children:
            return word(redirect.named_children[-1])
        if redirect.type == "heredoc_redirect":
            body = next((c for c in redirect.children if c.type == "heredoc_body"), None)
            if body is None:
                return _literal_word("")
            dynamic = any(c.type != "heredoc_content" for c in body.named_children)
            quoted = any(c.type == "heredoc_start" and c.text[:1] in (b"'", b'"') for c in redirect.children)
            text = body.text.decode(errors="replace")
            return Word(text, text, dynamic and not quoted, False)
    return None


def _join(args: list[Word]) -> Word:
    return Word(
        " ".join(a.text for a in args),
        " ".join(a.bare for a in args),
        any(a.expanded for a in args),
        any(a.pattern for a in args),
    )


def _option_value(args: list[Word], names: set[str]) -> Word | None:
    for index, arg in enumerate(args):
        if arg.text in names and index + 1 < len(args):
            return args[index + 1]
        for name in names:
            if name.startswith("--") and arg.text.startswith(name + "="):
                return _literal_word(arg.text.split("=", 1)[1]) if arg.literal else arg
    return None


def _shell_program(args: list[Word]) -> tuple[str, Word | None]:
    """Where a shell reads its program: ("string", -c's operand), ("file", the script) or ("stdin", None)."""
    i, command_string, from_stdin = 0, False, False
    while i < len(args):
        text = args[i].text
        if text == "--" or text == "-":
            i += 1
            break
        if text in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
            i += 2
            continue
        if text.startswith("--"):
            i += 1
            continue
        if text[:1] in ("-", "+") and len(text) > 1 and args[i].literal:
            command_string = command_string or "c" in text[1:]
            from_stdin = from_stdin or "s" in text[1:]
            i += 1
            continue
        break
    operands = args[i:]
    if command_string:
        return "string", operands[0] if operands else None
    if operands and not from_stdin:
        return "file", operands[0]
    return "stdin", None


def _reads_program_from_stdin(base: str, args: list[Word]) -> bool:
    if base in SHELLS:
        return _shell_program(args)[0] == "stdin"
    flags = INTERPRETERS.get(base)
    if flags is None:
        return False
    for arg in args:
        if arg.text in flags or any(arg.text.startswith(f) and len(f) == 2 for f in flags):
            return False
        if arg.text == "-":
            return True
        if not arg.text.startswith("-"):
            return False
    return True


def _decodes(base: str, args: list[Word]) -> bool:
    texts = [a.text for a in args]
    if base in ("base64", "base32", "basenc"):
        return any(
            t in ("-d", "-D", "--decode") or (t.startswith("-") and not t.startswith("--") and "d" in t) for t in texts
        )
    if base == "xxd":
        return any(t.startswith("-") and "r" in t for t in texts)
    if base in ("openssl", "gzip", "bzip2", "xz", "zstd", "lz4"):
        return any(
            t in ("-d", "--decompress", "--decode") or (t.startswith("-") and "d" in t[1:] and not t.startswith("--"))
            for t in texts
        )
    if base == "printf":
        return any("\\" in t or "%b" in t for t in texts)
    if base == "echo":
        return any(t.startswith("-") and "e" in t for t in texts)
    return base in DECODERS


def _find(args: list[Word]) -> Iterator[list[Word]]:
    """The commands find would run (-exec, -execdir, -ok, -okdir); refuses deleting from a critical start path."""
    i = 0
    while i < len(args) and (args[i].text in ("-H", "-L", "-P", "-D") or args[i].text.startswith("-O")):
        i += 2 if args[i].text == "-D" else 1
    starts = []
    while i < len(args) and not args[i].text.startswith("-") and args[i].text not in ("(", "!", ")", ","):
        starts.append(args[i])
        i += 1
    deletes = False
    commands = []
    while i < len(args):
        text = args[i].text
        if text == "-delete":
            deletes = True
        if text in ("-exec", "-execdir", "-ok", "-okdir"):
            end = i + 1
            while end < len(args) and args[end].text not in (";", "+"):
                end += 1
            commands.append(args[i + 1 : end])
            i = end
        i += 1
    for command in commands:
        if command and _basename(command[0].text) in DELETERS:
            deletes = True
    if deletes and any(_critical(start) for start in starts):
        raise Blocked("find_delete_critical", f"find {' '.join(s.text for s in starts)}")
    yield from commands


# -- rules that look at a command's arguments (also applied to a command embedded in another's arguments) -----------


def _rm(args: list[Word]) -> None:
    recursive, operands, options_done = False, [], False
    for arg in args:
        text = arg.text
        if not options_done and text == "--":
            options_done = True
        elif not options_done and text.startswith("--") and len(text) > 2:
            recursive = recursive or (len(text) >= 3 and "--recursive".startswith(text.split("=")[0]))
        elif not options_done and text.startswith("-") and len(text) > 1:
            recursive = recursive or "r" in text or "R" in text
        else:
            operands.append(arg)
    target = next((o for o in operands if _critical(o)), None)
    if recursive and target is not None:
        raise Blocked("rm_critical", f"rm -r {target.text}")


def _chmod(args: list[Word]) -> None:
    recursive = any(
        a.text == "--recursive" or (a.text[:1] == "-" and a.text[1:2] != "-" and "R" in a.text) for a in args
    )
    target = next((a for a in args if not a.text.startswith("-") and _critical(a)), None)
    if recursive and target is not None:
        raise Blocked("chmod_critical", target.text)


def _dd(args: list[Word]) -> None:
    for arg in args:
        if arg.text.startswith("of=") and _device(arg.text[3:]):
            raise Blocked("raw_disk_write", arg.text)


def _device_writer(args: list[Word]) -> None:
    for arg in args:
        if _device(arg.text):
            raise Blocked("raw_disk_write", arg.text)


def _kill(args: list[Word]) -> None:
    signal_given, options_done, i = False, False, 0
    while i < len(args):
        text = args[i].text
        if options_done or (signal_given and not text.startswith("--")):
            if text == "-1":
                raise Blocked("kill_all", "kill -1")
        elif text == "--":
            options_done = True
        elif text in ("-l", "-L", "--list", "--table"):
            return
        elif text in ("-s", "-n", "--signal"):
            signal_given = True
            i += 1
        elif text.startswith("-") and len(text) > 1:
            signal_given = True
        else:
            signal_given = True
            options_done = True
            continue
        i += 1


ARGUMENT_RULES: dict[str, Callable[[list[Word]], None]] = {
    "rm": _rm,
    "chmod": _chmod,
    "chown": _chmod,
    "chgrp": _chmod,
    "dd": _dd,
    "kill": _kill,
    **{name: _device_writer for name in DEVICE_WRITERS},
}


# -- the admin's rules: stored with the policy, edited in the admin console or as [sandbox.command_policy] --------


def rule_name_problem(name: str) -> str | None:
    """What is wrong with an admin rule's name beyond its pattern (aleph.toml and the admin console both ask)."""
    if name in HARDLINE:
        return f"{name!r} is a hardline rule's name; hardline rules cannot be replaced or switched off"
    return None


def rule_regex_problem(regex: str) -> str | None:
    try:
        re.compile(regex)
    except re.error as exc:
        return f"not a regular expression: {exc}"
    return None


class RuleSpec(BaseModel):
    """One [[sandbox.command_policy.custom_rules]] table."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(pattern=COMMAND_RULE_NAME)
    regex: str = Field(min_length=1, max_length=1000)
    action: Literal["block", "warn"]
    reason: str = Field(default="", max_length=500)

    @field_validator("name")
    @classmethod
    def _not_hardline(cls, value: str) -> str:
        problem = rule_name_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        problem = rule_regex_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class CommandPolicySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    custom_rules: list[RuleSpec] = Field(default_factory=list)

    @field_validator("custom_rules")
    @classmethod
    def _unique(cls, rules: list[RuleSpec]) -> list[RuleSpec]:
        names = [rule.name for rule in rules]
        duplicate = next((name for name in names if names.count(name) > 1), None)
        if duplicate is not None:
            raise ValueError(f"rule {duplicate!r} appears twice")
        return rules


class SandboxSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    command_policy: CommandPolicySpec = Field(default_factory=CommandPolicySpec)


class CommandPolicy:
    """The floor for exec-class tools (CommandFloor) and the same check the sandbox repeats before it runs anything.

    The admin's rules are part of the compiled policy: the floor reads them from the policy the call is decided by;
    the sandbox, in its worker thread, from `rules` (the current policy's in production, none by default)."""

    def __init__(self, *, rules: Callable[[], CommandRules] | None = None):
        self.rules = rules or (lambda: NO_COMMAND_RULES)

    def evaluate(self, *, language: str, text: str, rules: CommandRules | None = None) -> Verdict:
        if len(text) > MAX_SCRIPT_CHARS:
            return Verdict(Rule("parse_error", f"The program is longer than {MAX_SCRIPT_CHARS} characters."))
        analysis = Analysis()
        if language in SHELL_LANGUAGES:
            try:
                analysis.script(text)
            except Blocked as blocked:
                return Verdict(blocked.rule)
            except RecursionError:
                return Verdict(Rule("too_deep", HARDLINE["too_deep"]))
            except Exception as exc:  # the floor fails closed: what it cannot analyse does not run
                return Verdict(Rule("parse_error", f"The floor could not analyse the command ({exc!r})."))
        texts = [text, *analysis.commands]
        custom = self.rules() if rules is None else rules
        for rule in custom.block:
            if any(rule.pattern.search(t) for t in texts):
                return Verdict(Rule(rule.name, rule.reason or f"Blocked by the command policy rule {rule.name}."))
        warnings = tuple(Rule(r.name, r.reason) for r in custom.warn if any(r.pattern.search(t) for t in texts))
        return Verdict(None, warnings)

    def check(self, tool: BaseTool, args: Any, policy: CompiledPolicy) -> Decision | None:
        script = getattr(tool, "floor_script", None)
        if script is None:
            return None
        language, text = script(args)
        verdict = self.evaluate(language=language, text=text, rules=policy.command_rules)
        if verdict.blocked is None:
            return None
        rule = verdict.blocked
        return Decision(
            DENY,
            "floor",
            f"command_policy:{rule.name}",
            f"{rule.reason} The command-policy floor refuses it under every tier and permission entry.",
        )


def command_rules_replace(*, spec: CommandPolicySpec) -> dict[str, int]:
    """Make the stored rules exactly `spec`'s, keeping rows that did not change (and who last changed them)."""
    wanted = {rule.name: rule for rule in spec.custom_rules}
    existing = {row.name: row for row in CommandRule.objects.all()}
    removed = [row.pk for name, row in existing.items() if name not in wanted]
    CommandRule.objects.filter(pk__in=removed).delete()
    for name, rule in wanted.items():
        fields = {"regex": rule.regex, "action": rule.action, "reason": rule.reason}
        row = existing.get(name)
        if row is None:
            CommandRule.objects.create(name=name, **fields)
        elif any(getattr(row, key) != value for key, value in fields.items()):
            for key, value in fields.items():
                setattr(row, key, value)
            row.save()
    return {"rules": len(wanted), "removed": len(removed)}


def sandbox_section_apply(value: Any) -> None:
    try:
        spec = SandboxSpec.model_validate(value)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in ("sandbox", *error["loc"]))
        raise PolicyFileError(f"{where}: {error['msg']}", None) from None
    command_rules_replace(spec=spec.command_policy)


def sandbox_section_export() -> dict[str, Any]:
    rules = [
        {key: value for key, value in row.items() if value}
        for row in CommandRule.objects.order_by("name").values("name", "regex", "action", "reason")
    ]
    return {"command_policy": {"custom_rules": rules}} if rules else {}


section_register(Section("sandbox", sandbox_section_apply, sandbox_section_export))
