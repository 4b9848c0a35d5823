"""Splitting an ``#ELASTIC`` line, and a ``--prewarm`` command, into words. Standard library only, no I/O.

The rules (plugins/job_submit.lua has the same ones, byte for byte; tests/vectors/directives.json checks both):

- Words are separated by spaces and tabs.
- A word that starts with ``'`` or ``"`` is quoted: it runs to the next same quote, which must be followed by a
  space, a tab or the end; the quotes are not part of it. There are no escapes: ``"it's"`` and ``'say "hi"'``
  are how a quote is written inside a word.
- ``--opt='...'`` / ``--opt="..."``: a quote right after the first ``=`` of a word that starts with ``--``
  quotes the value the same way.
- A quote anywhere else is an ordinary character (``USR1'`` is the four letters and a quote).
- In a line, an unquoted word that starts with ``#`` starts a comment: the rest is not read.

A quoted word is never taken for an option or a comment (``--prewarm '--help'`` passes ``--help``).
"""

from __future__ import annotations

from dataclasses import dataclass

_BLANKS = b" \t"
_QUOTES = b"'\""


@dataclass(frozen=True)
class Word:
    text: bytes
    quoted: bool  # written in quotes as a whole (``'...'``), so never an option or a comment


class WordError(ValueError):
    """A line or command whose quotes do not close."""


def _closing(data: bytes, start: int) -> int:
    """Index of the quote that closes the one at ``start``; raises WordError."""
    q = data[start]
    end = data.find(bytes([q]), start + 1)
    if end < 0:
        raise WordError(f"unterminated {chr(q)} quote")
    if end + 1 < len(data) and data[end + 1] not in _BLANKS:
        raise WordError(f"text right after a closing {chr(q)} quote")
    return end


def split_words(data: bytes, *, comments: bool = True) -> list[Word]:
    """The words of ``data``; raises WordError for a quote that does not close (see the module docstring)."""
    out: list[Word] = []
    i, n = 0, len(data)
    while i < n:
        if data[i] in _BLANKS:
            i += 1
            continue
        if data[i] in _QUOTES:
            end = _closing(data, i)
            out.append(Word(data[i + 1:end], True))
            i = end + 1
            continue
        if comments and data[i] == 0x23:  # '#'
            break
        j = i
        while j < n and data[j] not in _BLANKS:
            j += 1
        word = data[i:j]
        eq = word.find(b"=")
        if word.startswith(b"--") and eq >= 0 and i + eq + 1 < n and data[i + eq + 1] in _QUOTES:
            end = _closing(data, i + eq + 1)
            out.append(Word(word[:eq + 1] + data[i + eq + 2:end], False))
            i = end + 1
            continue
        out.append(Word(word, False))
        i = j
    return out


def command_argv(command: str) -> list[str]:
    """The argument list of a ``--prewarm`` command (no shell); raises WordError."""
    raw = command.encode("utf-8", "surrogateescape")
    return [w.text.decode("utf-8", "surrogateescape") for w in split_words(raw, comments=False)]
