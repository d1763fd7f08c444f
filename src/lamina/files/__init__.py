"""File helpers every layer may import: the one output rule, atomic writes, JSON, folder fsync.

The leaf package at the bottom of the layer map (output_rule.py, folders.py, json_files.py;
every name is imported from here): it imports only the standard library and
``lamina.errors``, so the data layer, checkpoints and training runs share one way of writing
a file that readers see either whole or not at all.

The output rule, for every verb that writes (a file or a folder):
    1. every input is validated first (the verb's business; nothing here touches an output
       before ``write`` / ``build`` has run to its end);
    2. an output that is, holds or sits inside an input is refused (``refuse_overlap``);
    3. a file: a symlink is written through to its target; a character device or a FIFO is
       written directly (there is nothing to rename over); a block device or a socket is
       refused (``atomic_write``);
    4. a folder is built beside its final name and swapped in only once complete; an existing
       one is replaced only with ``force`` and only when lamina wrote it (the ``MARKER`` file
       it leaves in every folder it builds), or when it is empty (``build_folder``).

    ``atomic_write(path, write)``: call ``write(f)`` on a temp file beside ``path``, fsync it,
    ``os.replace`` it into place and fsync the folder (see rule 3 for links and devices).
    ``build_folder(out, build, force=, inputs=)``: rule 4; ``check_output_folder`` says up
    front whether it would refuse; ``mark_folder`` / ``is_lamina_folder`` for the marker.
    ``refuse_overlap(out, inputs)``: rule 2.
    ``write_json(path, data)`` / ``read_json(path)``: UTF-8 JSON, written atomically; reading
    errors name the file. ``loads_json(text, where)`` / ``json_lines(text, source)``: parsing
    that refuses data nested deeper than ``MAX_JSON_DEPTH`` (one line, never a RecursionError);
    ``check_depth(value, limit, where)`` measures any JSON-like value without recursing.
    ``to_json(data, **dumps_args)``: strict JSON text (NaN and infinities become null), what
    every --json line and JSONL output prints: jq and JSON.parse reject NaN.
    ``fsync_dir(folder)``: make renames inside ``folder`` durable where the platform allows.
    ``kind_of(path)``: "file", "folder", "FIFO", "character device", ... or "missing" (what a
    reader says when a path is not the regular file it needs: an existing FIFO is no "not
    found").
    ``mute_stream(stream)``: point a broken output stream's descriptor at /dev/null.

What this package deliberately does not know: tensors, models, tokenizers and runs.
"""

from __future__ import annotations

from lamina.files.folders import (
    MARKER,
    build_folder,
    check_output_folder,
    is_lamina_folder,
    mark_folder,
)
from lamina.files.json_files import (
    MAX_JSON_DEPTH,
    check_depth,
    json_lines,
    loads_json,
    read_json,
    to_json,
    write_json,
)
from lamina.files.output_rule import (
    Inputs,
    atomic_write,
    check_output_file,
    check_writable,
    fsync_dir,
    kind_of,
    mute_stream,
    refuse_overlap,
)

__all__ = [
    "Inputs",
    "MARKER",
    "MAX_JSON_DEPTH",
    "atomic_write",
    "build_folder",
    "check_depth",
    "check_output_file",
    "check_output_folder",
    "check_writable",
    "fsync_dir",
    "is_lamina_folder",
    "json_lines",
    "kind_of",
    "loads_json",
    "mark_folder",
    "mute_stream",
    "read_json",
    "refuse_overlap",
    "to_json",
    "write_json",
]
