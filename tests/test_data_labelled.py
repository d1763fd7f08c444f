"""Labelled texts: CSV/TSV/JSONL/folders, their errors, the stratified split, encoding, padding,
and the built-in genre task's speech parser."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from lamina.data.genre import speeches
from lamina.data.labelled import (
    CLS,
    OFFSET,
    PAD,
    encode_texts,
    label_names,
    pad_batch,
    read_labelled,
    stratified_split,
)
from lamina.errors import LaminaError
from lamina.tokenizers.kinds import CharTokenizer


def test_csv_with_quoted_newlines_and_chosen_columns(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text('id,body,team\n1,"line one\nline two, with comma",billing\n2,short,ops\n')
    data = read_labelled(p, text_column="body", label_column="team")
    assert data.texts == ["line one\nline two, with comma", "short"]
    assert data.labels == ["billing", "ops"]


def test_tsv_jsonl_and_folder(tmp_path):
    (tmp_path / "t.tsv").write_text("text\tlabel\nhello\ta\nbye\tb\n")
    assert read_labelled(tmp_path / "t.tsv").labels == ["a", "b"]
    rows = [{"text": "x", "label": "pos"}, {"text": "y", "label": 3}]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    data = read_labelled(tmp_path / "t.jsonl")
    assert data.texts == ["x", "y"] and data.labels == ["pos", "3"]
    for label, text in (("neg", "bad"), ("pos", "good"), ("pos", "fine")):
        (tmp_path / "f" / label).mkdir(parents=True, exist_ok=True)
        (tmp_path / "f" / label / f"{text}.txt").write_text(text)
    data = read_labelled(tmp_path / "f")
    assert sorted(zip(data.labels, data.texts, strict=True)) == [
        ("neg", "bad"),
        ("pos", "fine"),
        ("pos", "good"),
    ]


def test_bom_is_dropped(tmp_path):
    p = tmp_path / "t.csv"
    p.write_bytes("\ufefftext,label\nhi,a\n".encode())
    assert read_labelled(p).texts == ["hi"]


@pytest.mark.parametrize(
    "name, content, needle",
    [
        ("t.csv", "body,kind\nx,a\n", "its columns: 'body', 'kind'"),
        ("t.csv", "text,label\nx,a\ny,\n", "line 3: empty label"),
        ("t.jsonl", '{"text": "x", "label": "a"}\n{oops\n', "line 2: not valid JSON"),
        ("t.jsonl", '{"text": "x"}\n', "no 'label' field"),
        ("t.txt", "x\n", "unknown format"),
        ("t.csv", "text,label\n", "holds no labelled texts"),
    ],
)
def test_bad_files_name_the_problem(tmp_path, name, content, needle):
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(LaminaError, match=None) as exc:
        read_labelled(p)
    assert needle in str(exc.value) and str(p) in str(exc.value)


def test_invalid_utf8_names_file_and_line(tmp_path):
    p = tmp_path / "t.csv"
    p.write_bytes(b"text,label\nok,a\nbad \xff here,b\n")
    with pytest.raises(LaminaError, match=r"t\.csv line 3: not valid UTF-8"):
        read_labelled(p)


def test_a_single_class_is_refused():
    with pytest.raises(LaminaError, match="single label .'only'."):
        label_names(["only", "only"], "data.csv")
    assert label_names(["b", "a", "b"]) == ["a", "b"]


def test_stratified_split_keeps_proportions_and_is_seeded():
    labels = ["a"] * 50 + ["b"] * 30 + ["c"] * 20 + ["d"]
    train, val = stratified_split(labels, 0.2, seed=3)
    assert not set(train) & set(val) and len(train) + len(val) == len(labels)
    counts = Counter(labels[i] for i in val)
    assert counts == {"a": 10, "b": 6, "c": 4}  # 20% of each; the lone "d" stays in training
    again = stratified_split(labels, 0.2, seed=3)
    other = stratified_split(labels, 0.2, seed=4)
    assert np.array_equal(val, again[1]) and not np.array_equal(val, other[1])
    with pytest.raises(LaminaError, match="holds out no texts"):
        stratified_split(["a", "b"], 0.1, seed=0)


def test_encode_adds_cls_shifts_ids_and_counts_cuts():
    tok = CharTokenizer.from_text("abc")
    seqs, cut = encode_texts(tok, ["ab", "abcabc"], max_len=4)
    assert cut == 1
    assert seqs[0].tolist() == [CLS, *(i + OFFSET for i in tok.encode("ab"))]
    assert seqs[1].tolist() == [CLS, *(i + OFFSET for i in tok.encode("abc"))]
    with pytest.raises(LaminaError, match="--max-len must be an integer >= 2"):
        encode_texts(tok, ["a"], max_len=1)


def test_pad_batch_pads_right_with_a_mask():
    ids, mask = pad_batch([np.array([1, 5, 6]), np.array([1, 7])])
    assert ids.tolist() == [[1, 5, 6], [1, 7, PAD]]
    assert mask.tolist() == [[False, False, False], [False, False, True]]


def test_speech_parser_skips_cast_list_and_directions():
    play = (
        "A PLAY\n\nPERSONS REPRESENTED.\n\nDuke, a duke.\nFool, a fool.\n\n"
        "ACT I.\n\nScene I. A room.\n\n[Enter Duke.]\n\nDUKE.\nGood morrow, [Aside.] fool;\n"
        "how now?\n\nFool.\nAy.\n\n[Exeunt.]\n"
    )
    assert speeches(play) == ["Good morrow, fool; how now?", "Ay."]
