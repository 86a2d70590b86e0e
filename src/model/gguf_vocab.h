/* gguf_vocab: GGUF metadata as the Hugging Face files it replaces, so that a
 * lone GGUF file runs with its embedded tokenizer and chat template through
 * the same loaders as a Hugging Face folder (tok_load_json,
 * chat_template_from_config).
 *
 * The tokenizer.ggml.* keys are read as llama.cpp's convert_hf_to_gguf.py
 * writes them for byte-level BPE models (tokenizer.ggml.model "gpt2"):
 * tokens in id order with their token_type (1 normal, 2 unknown, 3 control,
 * 4 user-defined, 5 unused, 6 byte) and merges as "a b". Normal and byte
 * tokens form the BPE vocab; control and unknown tokens become special added
 * tokens, user-defined ones non-special added tokens (Qwen's <think>,
 * <tool_call>); unused ones are the converter's [PADn] fill up to the model's
 * vocab size, which the Hugging Face tokenizer does not have: they stay gaps.
 * The converter also types as control the added tokens that look special
 * (<|...|>) whatever their Hugging Face flag, so Qwen's <|fim_prefix|> and kin
 * come back special. The normalizer, pre-tokenizer and decoder, which GGUF
 * does not store, come from the name in tokenizer.ggml.pre:
 *   qwen2           Qwen2, Qwen3, Qwen3-Next: NFC, Qwen's Split regex, ByteLevel
 *   qwen35          Qwen3.5: NFC, the same regex with marks (\p{M}) in words
 *   pixtral, tekken Nemotron-H (Mistral's tekken tokenizer): no normalizer,
 *                   the tekken Split regex, ByteLevel
 * Other names are refused.
 *
 * Every index is checked (token ids, array lengths, merge tokens) and every
 * string validated as UTF-8 without NUL bytes, so a hostile file ends in an
 * error naming the file and the key. Results are new JSON references owned
 * by the caller; g is only read. */
#ifndef KP_GGUF_VOCAB_H
#define KP_GGUF_VOCAB_H

#include "gguf.h"

#include <jansson.h>

/* A tokenizer.json-shaped object (normalizer, pre_tokenizer, decoder, model
 * {type BPE, vocab, merges}, added_tokens). NULL with err_set() otherwise. */
json_t *gguf_vocab_tokenizer_json(const struct gguf *g);

/* A tokenizer_config.json-shaped object: chat_template from
 * tokenizer.chat_template, and bos_token, eos_token, unk_token, pad_token,
 * sep_token, cls_token, mask_token as the strings of the tokens whose ids
 * tokenizer.ggml.*_token_id give, each where the file has it. NULL with
 * err_set() otherwise. */
json_t *gguf_vocab_tokenizer_config(const struct gguf *g);

#endif
