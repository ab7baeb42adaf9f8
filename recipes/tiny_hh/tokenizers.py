"""A byte-level BPE trained on the dialogues: a Qwen-style chat tokenizer for the policy, a DeBERTa-style one
for the reward model."""

from __future__ import annotations

from collections.abc import Sequence

# --------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
POLICY_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
RM_SPECIAL = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]


def train_bpe(texts: Sequence[str], vocab_size: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` holding both policy and reward-model special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    # The exact normalizer / pre-tokenizer of transformers' Qwen2Tokenizer, which rebuilds them when
    # AutoTokenizer loads the policy directory (model_type qwen2): training and loading must agree.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=POLICY_SPECIAL + RM_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def make_policy_tokenizer(bpe):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    t = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(bpe.to_str()),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=1024,
        padding_side="left",
    )
    t.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    t.chat_template = CHAT_TEMPLATE
    return t


def make_rm_tokenizer(bpe, max_length: int = 512):
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(bpe.to_str())
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        mask_token="[MASK]",
        model_max_length=max_length,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def make_policy_tokenizer_template_text(messages) -> str:
    """Chat-template text (without a tokenizer) used to let BPE see the template markup."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
