"""Trains tiny SentencePiece BPE models, writes their vocabularies to GGUF the way llama.cpp's
convert_hf_to_gguf.py writes a Llama/Mistral tokenizer.model (tokenizer.ggml.model = "llama"),
and records what sentencepiece itself encodes and decodes, so the Rust test can compare the
tokenizer ft-actor rebuilds from the GGUF against the reference implementation.

usage: spm_to_gguf.py OUT_DIR CASES_JSON
Writes OUT_DIR/<variant>.gguf and OUT_DIR/expected.json:
  {"<variant>": {"gguf": path, "bos": id, "cases": [{"text", "ids", "decoded"}]}}
where ids include the BOS and decoded is sentencepiece's decode of the ids after it.
Needs gguf-py and sentencepiece."""
import io, json, os, re, sys
import gguf
import sentencepiece as spm

# Small but varied: spaces, runs of spaces, digits, punctuation, accents, CJK, emoji. Lines are
# SentencePiece's training sentences, so no piece can hold a newline (as in Llama's model).
CORPUS = """The quick brown fox jumps over the lazy dog.
The router selects the top experts for every token, then mixes their outputs.
Hello world! Hello there, world. Hello again: hello, hello?
def forward(x, y):  return x + y * 2  # two spaces   three spaces
Numbers: 0 1 2 3 4 5 6 7 8 9, 12345 and 3.14159 and 2024-06-01.
Ünïcödé café naïve façade déjà vu, résumé, crème brûlée, Ærøskøbing.
日本語のテキストです。東京は大きい都市です。日本語 日本 本日
中文文本：你好，世界！我们在测试分词器。
Emoji: 🙂 🚀 🎉 ❤️ — "quotes" 'single' (parens) [brackets] {braces} <angles>
    indented line with leading spaces
trailing spaces here   
a  b   c    d     e
Mixture of experts models route tokens to experts; experts specialize.
the the the and and of of to to in in is is it it for for on on
"""

VARIANTS = {
    # Llama / Mistral: a dummy prefix, and llama.cpp's default add_space_prefix.
    "prefix": True,
    # A model trained without the dummy prefix, written with add_space_prefix = false.
    "noprefix": False,
}

HARD_CASES = [
    "",
    " ",
    "   ",
    "x",
    "   leading spaces",
    "trailing spaces   ",
    "a  b   c    d",
    "\n",
    "line one\nline two\n\n\nend",
    "\ttab\tseparated\t",
    " \n \n ",
    "0123456789 9876543210",
    "3.14159, -42; 1e-9!",
    "naïve façade — déjà vu",
    "日本語のテキスト",
    "🙂🚀🎉",
    # Characters absent from the training text: byte fallback.
    "Ω≈ç√ ☃ 한국어 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 Ğğ",
    "~`^|\\@#$%&*_+=",
    # Control tokens typed in the text.
    "</s>",
    "Hello</s>world",
    "hello </s> world",
    "<s>Hello</s>",
    "x</s>",
    "</s> \n</s>",
]


def train(prefix):
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines()),
        model_writer=out,
        model_type="bpe",
        vocab_size=600,
        byte_fallback=True,
        character_coverage=1.0,
        # Llama's settings: text untouched, whitespace kept, digits split.
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=prefix,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=out.getvalue())


def write_gguf(sp, path, prefix, pad_to):
    # convert_hf_to_gguf.py's _create_vocab_sentencepiece: every piece with its score and type,
    # then `[PAD{i}]` placeholders up to the model's vocab_size.
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        kind = gguf.TokenType.NORMAL
        if sp.IsUnknown(i):
            kind = gguf.TokenType.UNKNOWN
        elif sp.IsControl(i):
            kind = gguf.TokenType.CONTROL
        elif sp.IsUnused(i):
            kind = gguf.TokenType.UNUSED
        elif sp.IsByte(i):
            kind = gguf.TokenType.BYTE
        tokens.append(sp.IdToPiece(i))
        scores.append(sp.GetScore(i))
        types.append(kind)
    for i in range(len(tokens), pad_to):
        tokens.append(f"[PAD{i}]")
        scores.append(-1000.0)
        types.append(gguf.TokenType.UNUSED)
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if not prefix:
        w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def reference_ids(sp, text):
    """sentencepiece's ids for `text` after a BOS. sentencepiece reads control pieces typed in
    text as plain characters; llama.cpp and HF match them as tokens and encode the text between
    them separately, so that is done here too, each fragment by sentencepiece."""
    controls = [sp.IdToPiece(i) for i in range(sp.vocab_size()) if sp.IsControl(i)]
    pattern = "(" + "|".join(re.escape(c) for c in controls) + ")"
    ids = [sp.bos_id()]
    for part in re.split(pattern, text):
        if part in controls:
            ids.append(sp.PieceToId(part))
        elif part:
            ids.extend(sp.encode(part))
    return ids


def main():
    out_dir, cases_path = sys.argv[1], sys.argv[2]
    with open(cases_path, encoding="utf-8") as f:
        texts = [c["text"] for c in json.load(f)["encode"]] + HARD_CASES
    expected = {}
    for name, prefix in VARIANTS.items():
        sp = train(prefix)
        path = os.path.join(out_dir, f"{name}.gguf")
        write_gguf(sp, path, prefix, pad_to=sp.vocab_size() + 3)
        cases = []
        for text in texts:
            ids = reference_ids(sp, text)
            cases.append({"text": text, "ids": ids, "decoded": sp.decode(ids[1:])})
        expected[name] = {"gguf": path, "bos": sp.bos_id(), "cases": cases}
    with open(os.path.join(out_dir, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
