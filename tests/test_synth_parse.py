"""Parsing generator replies: the forms prompts ask for, and bad replies actually seen from SmolLM2-135M."""

from __future__ import annotations

import pytest

from obliq.synth.parse import parse_reply


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("<query>essays that argue by analogy</query>", "essays that argue by analogy"),
        (
            "Sure! <QUERY> problems solved by counting arrangements </QUERY> hope it helps",
            "problems solved by counting arrangements",
        ),
        ('{"query": "problems solved by counting arrangements"}', "problems solved by counting arrangements"),
        ('```json\n{"query": "problems solved by counting"}\n```', "problems solved by counting"),
        ("Query: problems solved by counting arrangements", "problems solved by counting arrangements"),
        ("**Search query:** problems solved by counting arrangements", "problems solved by counting arrangements"),
        ('Here is a query: "problems solved by counting arrangements"', "problems solved by counting arrangements"),
        (
            "Query:\n\nproblems solved by counting arrangements\n\nThis query works because...",
            "problems solved by counting arrangements",
        ),
    ],
)
def test_accepted_forms(reply, expected):
    parsed = parse_reply(reply, "query", min_words=3, max_words=30)
    assert parsed.ok and parsed.text == expected


# Replies SmolLM2-135M-Instruct actually gave to obliq's prompts (CPU, temperature 0.7), verbatim, with
# their documents and whether the reply was cut by the token limit. SmolLM2 never used the tags asked for.
TWEET = "Fair IS fair if U believe an unborn child has no right to life, then UR saying I can decide if you do??"
SETS = "How many ways are there to divide a set of 8 elements into 5 non-empty ordered subsets?"
JET = (
    "Each of the four jet engines on an Airbus A380 airliner develops athrust (a forward force on the airliner) of "
    "322,000 N (72,000 lb).When the airplane is flying at 250 m/s, what horsepower does each engine develop?"
)
FBI = (
    "Mr. Richmond: And I believe it's--I believe it's only that one. Out of all of the special agents in charge of "
    "FBI bureaus around the country, how many are African American?"
)
SEEN = [
    # a lead-in paragraph ending with a colon, then the query; it ran to the limit (48 tokens)
    (
        "To reflect the property abstractly, here's a rewritten query:\n\nThis tweet is a clear example of Fair IS Fair, "
        "where it is implied that U can decide if you do not have the right to life, even if you believe",
        "query",
        TWEET,
        True,
        "overlong",
        None,
    ),
    (
        "To reflect the property abstractly, here's a rewritten query:\n\nThis tweet is a clear example of Fair IS Fair, "
        "where it is implied that U can decide if you do not have the right to life, even if you believe",
        "query",
        TWEET,
        False,
        "ok",
        "This tweet is a clear example of Fair IS Fair, where it is implied that U can decide if you do not have the "
        "right to life, even if you believe",
    ),
    # a refusal
    (
        "I'm afraid I'm unable to provide a search query, as I am not able to access any specific text.",
        "query",
        TWEET,
        False,
        "refusal",
        None,
    ),
    # an answer instead of a query, cut by the limit
    (
        "To solve this problem, you need to integrate the sine function with respect to t. The integral is a fundamental "
        "operation in calculus, and it involves trigonometric substitution and integration. The solution involves "
        "trigonometric substitution and integration, which is a crucial",
        "query",
        JET,
        True,
        "overlong",
        None,
    ),
    # Stage A quoting the problem verbatim (10 words in a row), then a list cut by the limit
    (
        "The answer to this math problem is a combination of arithmetic and combinatorics that involves counting the "
        "number of ways to divide a set of 8 elements into 5 non-empty ordered subsets. The technique involves using "
        "the concept of discrete sets to represent the problem and the use of combinatorics to solve it.\n\nHere is "
        "the abstract mathematical technique needed to solve it: \n\n1. Counting the number",
        "description",
        SETS,
        True,
        "copied",
        None,
    ),
    # Stage A whose first paragraph ends in a lead-in ("The formula is:"), then a cut formula
    (
        "This problem requires a mathematical solution, and the answer is in the form of a quantity multiplied by a "
        "factor. To solve this problem, you can use the mathematical formula for a power of a number (the power of the "
        "numerator multiplied by the denominator). The formula is:\n\nN = (N1 * N2",
        "description",
        JET,
        True,
        "ok",
        "This problem requires a mathematical solution, and the answer is in the form of a quantity multiplied by a "
        "factor. To solve this problem, you can use the mathematical formula for a power of a number (the power of the "
        "numerator multiplied by the denominator).",
    ),
    # Stage A cut mid-sentence: the finished sentence is kept
    (
        "The tweet is a clear example of an implicit moral stance, where the author defies the conventions of academic "
        'discourse. The language of fairness and the use of the word "rights" is overly complex and can be interpreted '
        "as a defense of the legal system, but it also carries a moral message, suggesting that there is a",
        "description",
        TWEET,
        True,
        "ok",
        "The tweet is a clear example of an implicit moral stance, where the author defies the conventions of academic "
        "discourse.",
    ),
    # a lead-in, then a quoted question cut by the limit
    (
        "The question was:\n\n\"What does it mean, when someone says, 'it's only one of the special agents in charge of "
        "the FBI's Bureaus?' Do you have it written on a piece of paper, and is",
        "query",
        FBI,
        True,
        "overlong",
        None,
    ),
    # a made-up word as its own paragraph, then a solution cut by the limit
    (
        "Athrobotics\n\n*Athrobotics*\n\n## Answer\n\nTo solve this math problem, we will first find the engine's thrust "
        "and then multiply it by the engine's power. We will use a formula to find the power of each en",
        "query",
        JET,
        True,
        "too-short",
        None,
    ),
    # Stage A answering the problem instead of describing the technique
    ("The answer is 0.", "description", SETS, False, "too-short", None),
    # a sentence, a lead-in, then a bullet list: the sentence is kept
    (
        "This is an example of a rhetorical question that requires the audience to respond in a more structured way "
        'than a typical question. Here\'s a breakdown of the format:\n\n* A question begins with "What?" followed by '
        "an ellipsis",
        "query",
        FBI,
        True,
        "ok",
        "This is an example of a rhetorical question that requires the audience to respond in a more structured way "
        "than a typical question.",
    ),
]


@pytest.mark.parametrize("reply, tag, document, cut, outcome, text", SEEN)
def test_replies_seen_from_smollm2(reply, tag, document, cut, outcome, text):
    limits = (5, 80) if tag == "description" else (4, 40)
    parsed = parse_reply(reply, tag, *limits, document=document, whole_sentences=tag == "description", truncated=cut)
    if outcome == "ok":
        assert parsed.ok and parsed.text == text
    else:
        assert not parsed.ok and parsed.reason == outcome


@pytest.mark.parametrize(
    "reply, reason",
    [
        ("<query>problems solved by counting arrangements", "malformed"),  # cut before the closing tag
        ("problems solved</query>", "malformed"),
        ('{"query": "problems solved by counting', "malformed"),
        ('{"answer": "problems solved by counting"}', "malformed"),
        ('{"query": 3}', "malformed"),
        ("<query>   </query>", "empty"),
        ("<query>counting</query>", "too-short"),
        ("As an AI language model, I cannot write queries.", "refusal"),
    ],
)
def test_rejected(reply, reason):
    parsed = parse_reply(reply, "query", min_words=3, max_words=30)
    assert not parsed.ok and parsed.reason == reason and parsed.text is None


def test_copy_check_counts_runs_of_words():
    doc = "The committee asked the witness about the budget for next year and she declined to answer."
    assert (
        parse_reply("asked the witness about the budget for next year", "query", 3, 30, doc, copy_ngram=8).reason
        == "copied"
    )
    assert parse_reply("asked the witness about the budget for next", "query", 3, 30, doc, copy_ngram=9).ok  # 8 < 9
    assert parse_reply("asked the witness about the budget for next year", "query", 3, 30, doc, copy_ngram=0).ok
