"""Teachers: the stylometric features against hand counts and scikit-learn, the encoder teacher
against sentence-transformers (issue 5)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.feature_extraction.text import TfidfVectorizer

from obliq.eval.teachers import (
    EncoderTeacher,
    StylometricConfig,
    StylometricTeacher,
    load_teacher,
)
from obliq.text import load_function_words

TEXTS = ["The cat and the dog.", "A dog ran to the park.", "It is what it is."]
WORDS = ["the", "and", "a", "to", "it", "is"]
# relative frequencies counted by hand: tokens 5, 6, 5
HAND = np.array(
    [
        [2 / 5, 1 / 5, 0, 0, 0, 0],
        [1 / 6, 0, 1 / 6, 1 / 6, 0, 0],
        [0, 0, 0, 0, 2 / 5, 2 / 5],
    ]
)


def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture
def word_file(tmp_path):
    path = tmp_path / "words.txt"
    path.write_text("# test list\n" + "\n".join(WORDS) + "\n")
    return str(path)


def test_function_word_block_is_z_scored_hand_frequencies(word_file):
    teacher = StylometricTeacher(StylometricConfig(function_words=word_file, function_word_weight=1.0, min_df=1))
    v = teacher.encode(TEXTS)
    z = (HAND - HAND.mean(0)) / HAND.std(0)
    fw = v[:, -len(WORDS) :]
    np.testing.assert_allclose(fw, unit(z), atol=1e-6)
    np.testing.assert_allclose(v[:, : -len(WORDS)], 0, atol=1e-7)  # weight 1: no character block


def test_cosine_is_the_weighted_mean_of_the_block_cosines(word_file):
    w = 0.3
    cfg = StylometricConfig(
        ngram_min=1, ngram_max=3, max_features=None, min_df=1, function_words=word_file, function_word_weight=w
    )
    v = StylometricTeacher(cfg).encode(TEXTS)
    assert v.dtype == np.float32 and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-6)
    char = TfidfVectorizer(analyzer="char", ngram_range=(1, 3), lowercase=False, sublinear_tf=True).fit_transform(TEXTS)
    char = unit(char.toarray())
    fw = unit((HAND - HAND.mean(0)) / HAND.std(0))
    expected = (1 - w) * char @ char.T + w * fw @ fw.T
    np.testing.assert_allclose(v @ v.T, expected, atol=1e-5)


def test_defaults_are_deterministic_and_fit_on_first_encode():
    texts = [f"Sentence number {i} is here, and it has some words in it." for i in range(5)] + TEXTS
    a = StylometricTeacher().encode(texts)
    b = StylometricTeacher().encode(texts)
    np.testing.assert_array_equal(a, b)
    teacher = StylometricTeacher().fit(texts)
    np.testing.assert_allclose(teacher.encode(texts[:2]), a[:2], atol=1e-6)  # fitted on all, applied to two
    assert teacher.describe()["kind"] == "stylometric"


def test_bad_input_is_named(tmp_path):
    with pytest.raises(ValueError, match="text 1 has|e.g. text 1"):
        StylometricTeacher(StylometricConfig(min_df=1)).encode(["Some words here, the end.", ""])
    with pytest.raises(ValueError, match="ngram_min <= ngram_max"):
        StylometricConfig(ngram_min=4, ngram_max=2)
    with pytest.raises(ValueError, match=r"function_word_weight must lie in \[0, 1\]"):
        StylometricConfig(function_word_weight=1.5)
    with pytest.raises(FileNotFoundError, match="not a built-in list"):
        load_function_words("no-such-list")
    bad = tmp_path / "bad.txt"
    bad.write_text("the\nof the\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: expected one word a line"):
        load_function_words(str(bad))


def test_builtin_function_word_lists():
    mw = load_function_words("mosteller-wallace")
    assert len(mw) == 70 and mw[:3] == ["a", "all", "also"] and "upon" in mw
    assert set(mw) <= set(load_function_words("english"))


@pytest.mark.slow
def test_encoder_teacher_matches_sentence_transformers(minilm_path):
    from sentence_transformers import SentenceTransformer

    teacher = load_teacher("minilm")
    assert isinstance(teacher, EncoderTeacher) and teacher.trust_remote_code is False
    v = teacher.encode(TEXTS)
    ref = SentenceTransformer(minilm_path, device="cpu").encode(TEXTS, normalize_embeddings=True)
    assert v.shape == (3, 384) and v.dtype == np.float32
    np.testing.assert_allclose(v, ref, atol=1e-5)


def test_trust_remote_code_is_off_by_default_and_passed_only_when_asked(monkeypatch):
    import obliq.eval.encoders as encoders

    calls = []
    monkeypatch.setattr(encoders, "load_encoder", lambda model, encoder, **kw: calls.append(kw) or object())
    EncoderTeacher("some/hub-model")
    load_teacher("some/hub-model", trust_remote_code=True)
    assert [c["trust_remote_code"] for c in calls] == [False, True]


def test_a_mistyped_teacher_or_model_name_is_named_not_sent_to_the_hub():
    assert isinstance(load_teacher("Stylometric"), StylometricTeacher)
    with pytest.raises(ValueError, match="did you mean 'stylometric'"):
        load_teacher("stylometic")
    with pytest.raises(FileNotFoundError, match="'minlm' is not an alias .*did you mean 'minilm'"):
        load_teacher("minlm")
