"""PairwiseRewardModel: exact pair encoding, batching invariance, truncation, TRL usability, offline check."""

from __future__ import annotations

import time

import pytest
import torch

from recipes.hh_common.hub_access import HubUnavailableError
from recipes.hh_common.rewards import PairwiseRewardModel

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUESTIONS = [
    "How do I boil an egg?",
    "What is the best way to prune roses?",
    "Any tips to save money?",
    "How do I learn guitar?",
    "Why is the sky blue?",
    "Can you help me pack a suitcase?",
    "How do I back up my files?",
    "What should I do to start running?",
    "Tell me a joke.",
    "How do I cook pasta?",
]
ANSWERS = [
    "Put the egg in boiling water for nine minutes.",
    "Whatever.",
    "Make a monthly budget and track it.",
    "Learn a few basic chords and play slowly.",
    "Sunlight scatters.",
    "Roll your clothes, really.",
    "Copy them to an external drive on a schedule. " * 3,
    "Mix short runs with walking.",
    "No.",
    "Use plenty of salted water and taste a piece.",
]


@pytest.fixture(scope="module")
def tiny_rm_dir(tmp_path_factory):
    """A random tiny DeBERTa-v2 classifier with *segment embeddings* (type_vocab_size=2), so that a reward
    function that dropped the pair's token_type_ids would give different scores than the manual reference."""
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    from recipes.tiny_hh.tokenizers import make_rm_tokenizer, train_bpe

    bpe = train_bpe(QUESTIONS + ANSWERS, vocab_size=300)
    tok = make_rm_tokenizer(bpe, max_length=128)
    torch.manual_seed(0)
    cfg = DebertaV2Config(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        type_vocab_size=2,
        relative_attention=True,
        position_buckets=16,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=True,
        pooler_hidden_size=32,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        initializer_range=0.5,
    )
    model = DebertaV2ForSequenceClassification(cfg)
    with torch.no_grad():  # make segment embeddings matter
        model.deberta.embeddings.token_type_embeddings.weight.normal_(0, 1.0)
    d = tmp_path_factory.mktemp("tiny_rm")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def manual_scores(d, questions, answers, max_length=None):
    """Independent reference: the model-card recipe, one pair at a time, via the Auto classes."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForSequenceClassification.from_pretrained(d).eval()
    out = []
    for q, a in zip(questions, answers, strict=True):
        kw = {"truncation": True, "max_length": max_length} if max_length else {}
        inputs = tok(q, a, return_tensors="pt", **kw)
        assert "token_type_ids" in inputs and inputs["token_type_ids"].sum() > 0
        with torch.no_grad():
            out.append(model(**inputs).logits[0, 0].item())
    return out


def test_scores_match_manual_pair_encoding(tiny_rm_dir):
    rm = PairwiseRewardModel(str(tiny_rm_dir), batch_size=4)
    assert not rm.model.training  # dropout off
    # conversational prompts (multi-turn: the question is the last user turn) + conversational completions
    prompts = [
        [
            {"role": "user", "content": "earlier question"},
            {"role": "assistant", "content": "earlier answer"},
            {"role": "user", "content": q},
        ]
        for q in QUESTIONS
    ]
    completions = [[{"role": "assistant", "content": a}] for a in ANSWERS]
    got = rm(prompts=prompts, completions=completions, completion_ids=None, trainer_state=None)
    ref = manual_scores(tiny_rm_dir, QUESTIONS, [a.strip() for a in ANSWERS])
    assert isinstance(got, list) and all(isinstance(x, float) for x in got) and len(got) == len(QUESTIONS)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-3, atol=1e-4)
    # plain-string prompts / completions give the same numbers
    got_str = rm(QUESTIONS, [a.strip() for a in ANSWERS])
    torch.testing.assert_close(torch.tensor(got_str), torch.tensor(ref), rtol=1e-3, atol=1e-4)
    # the check above can fail: scores differ across pairs, and dropping the segment ids changes them
    assert max(ref) - min(ref) > 1e-2
    enc = rm.encode(QUESTIONS, ANSWERS)
    assert enc["token_type_ids"].sum() > 0
    with torch.no_grad():
        no_tt = rm.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits[:, 0]
    assert (no_tt - torch.tensor(ref)).abs().max() > 1e-2


def test_batching_invariant(tiny_rm_dir):
    rm1 = PairwiseRewardModel(str(tiny_rm_dir), batch_size=1)
    rm8 = PairwiseRewardModel(str(tiny_rm_dir), batch_size=8)
    s1, s8 = rm1(QUESTIONS, ANSWERS), rm8(QUESTIONS, ANSWERS)
    torch.testing.assert_close(torch.tensor(s1), torch.tensor(s8), rtol=1e-3, atol=1e-4)


def test_truncation_of_overlong_answer(tiny_rm_dir):
    rm = PairwiseRewardModel(str(tiny_rm_dir), batch_size=2)
    assert rm.max_length == 128
    long_answer = "Put the egg in boiling water and wait. " * 200
    enc = rm.encode([QUESTIONS[0]], [long_answer])
    assert enc["input_ids"].shape[1] == 128
    q_ids = rm.tokenizer(QUESTIONS[0], add_special_tokens=False)["input_ids"]
    # longest_first: the (short) question is kept whole, the answer is cut
    assert enc["input_ids"][0, 1 : 1 + len(q_ids)].tolist() == q_ids
    got = rm([QUESTIONS[0], QUESTIONS[1]], [long_answer, ANSWERS[1]])
    ref = manual_scores(tiny_rm_dir, [QUESTIONS[0], QUESTIONS[1]], [long_answer, ANSWERS[1]], max_length=128)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-3, atol=1e-4)
    assert all(torch.isfinite(torch.tensor(got)))


def test_conversation_question_mode(tiny_rm_dir):
    rm = PairwiseRewardModel(str(tiny_rm_dir), question="conversation")
    prompt = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": QUESTIONS[0]},
    ]
    got = rm([prompt], [ANSWERS[0]])
    ref = manual_scores(
        tiny_rm_dir, [f"Human: Hi\n\nAssistant: Hello!\n\nHuman: {QUESTIONS[0]}"], [ANSWERS[0]]
    )
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-3, atol=1e-4)
    # raw HH string prompt with a trailing generation marker renders the same question
    raw = f"\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: {QUESTIONS[0]}\n\nAssistant:"
    torch.testing.assert_close(torch.tensor(rm([raw], [ANSWERS[0]])), torch.tensor(ref), rtol=1e-3, atol=1e-4)


def test_trl_reward_func_contract_and_device(tiny_rm_dir):
    from trl.trainer.utils import get_callable_name

    rm = PairwiseRewardModel(str(tiny_rm_dir), device="cpu")
    assert rm.__name__ == tiny_rm_dir.name and get_callable_name(rm) == tiny_rm_dir.name
    assert PairwiseRewardModel(str(tiny_rm_dir), name="oa_rm").__name__ == "oa_rm"
    assert rm.to("cpu") is rm and rm.device.type == "cpu"
    assert rm([], []) == []
    with pytest.raises(ValueError):
        rm(QUESTIONS[:2], ANSWERS[:1])


def test_preloaded_objects_and_validation(tiny_rm_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(tiny_rm_dir)
    tok = AutoTokenizer.from_pretrained(tiny_rm_dir)
    rm = PairwiseRewardModel(model=model, tokenizer=tok, batch_size=3)
    torch.testing.assert_close(
        torch.tensor(rm(QUESTIONS, ANSWERS)),
        torch.tensor(manual_scores(tiny_rm_dir, QUESTIONS, ANSWERS)),
        rtol=1e-3,
        atol=1e-4,
    )
    with pytest.raises(ValueError):
        PairwiseRewardModel(str(tiny_rm_dir), question="everything")
    with pytest.raises(ValueError):
        PairwiseRewardModel()


def test_offline_uncached_model_id_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.time()
    with pytest.raises(HubUnavailableError) as e:
        PairwiseRewardModel("OpenAssistant/reward-model-deberta-v3-large-v2")
    assert time.time() - t0 < 10
    assert "OpenAssistant/reward-model-deberta-v3-large-v2" in str(
        e.value
    ) and "--config recipes/configs/hh_rlhf_tiny.yaml" in str(e.value)
