// tests/data/text/gen_tiktoken_ref.cjs: writes tiktoken_ref.json, the reference that
// tests/test_text.c checks Ember's pre-tokenizers and the Kimi tokenizer against. It runs
// OpenAI's tiktoken (npm "tiktoken", the Rust crate compiled to WASM: fancy-regex semantics,
// exactly what Moonshot's tokenization_kimi.py runs) and so is independent of PCRE2.
//
//   npm install --prefix /tmp/tt tiktoken@1.0.22
//   NODE_PATH=/tmp/tt/node_modules node tests/data/text/gen_tiktoken_ref.cjs > tests/data/text/tiktoken_ref.json
//
// "splits": for each pattern and text, the pieces the pattern cuts the text into. tiktoken
// has no split API, so each text gets its own vocabulary holding all 256 bytes and every
// byte substring of the text: every piece is then in the vocabulary and tiktoken emits it
// as one token (encode_ordinary looks a whole piece up before running BPE).
// "kimi_a": ids of Kimi's tokenizer (pat_str, allowed_special "all") over
// tests/fixtures/kimi_a/tiktoken.model with the specials of its tokenizer_config.json laid
// out as tokenization_kimi.py does (ids n_ranks .. n_ranks+257; unnamed ones
// <|reserved_token_{id}|>).
// "probe": the same over probe.tiktoken (written next to this file), 480 ranks: first, for
// every two neighbouring characters of the seed strings below, the 2-byte token of the first
// one's last byte and the second one's first byte (ranked first, so BPE joins them whenever
// they are in one piece); then byte-level BPE learned from the texts themselves with no
// pre-splitting. Many tokens straddle the places where pre-tokenizers cut, so a different
// cut shows up as different ids.
// Its 480 ranks fit kimi_a's vocab_size (512 with the 32 specials), so `ember convert` can
// turn kimi_a with this file in place of its tiktoken.model into a model GGUF.
"use strict";
const { Tiktoken } = require("tiktoken/lite");
const fs = require("fs");
const path = require("path");

const R = String.raw;
const patterns = {
  "kimi-k2": [
    R`[\p{Han}]+`,
    R`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
    R`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
    R`\p{N}{1,3}`,
    R` ?[^\s\p{L}\p{N}]+[\r\n]*`,
    R`\s*[\r\n]+`,
    R`\s+(?!\S)`,
    R`\s+`,
  ].join("|"),
  "gpt-2": R`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`,
  "llama-bpe": R`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
  "qwen2": R`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
};

const texts = [
  "Tell me about the french revolution.",
  "The quick brown fox jumps over the lazy dog.",
  "Numbers: 12345 and 2024-07-14, price $9.99!",
  "  leading spaces\n\nand new lines\r\n",
  "unicode: café naïve 你好世界",
  "don't I'M you're We'VE they'll she'd it's O'Neil 'tis",
  "getUserName iPhone helloWorld HTTPServer XMLHttpRequest ABCdef aBC",
  "CamelCase_snake_case kebab-case SCREAMING_CASE",
  "1234567 3.14159 1e10 0x1F 1,000,000 ½ ² ٣٤٥ 四五",
  "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ１２３ ｶﾀｶﾅ",
  "你好，世界。今天天气很好！「引号」《书名》",
  "こんにちは、世界。カタカナとひらがなと漢字々〆〇",
  "한국어 텍스트입니다. 안녕하세요!",
  "Русский текст, Ελληνικά γράμματα, עברית, العربية",
  "नमस्ते दुनिया, हिन्दी में पाठ",
  "ภาษาไทยไม่มีช่องว่าง",
  "e\u0301 a\u0308 n\u0303o combining: \u0301\u0302x",
  "emoji 👍🏽 👨‍👩‍👧 🇫🇷 ❤️ 🙂🙂🙂",
  "tabs\tand\t\tmore\ttabs \t mixed",
  "trailing spaces   ",
  "   \n  \n\n   x  \r\n\r\n  y\n",
  "nbsp\u00a0here\u3000ideographic\u2028line\u2029para\u0085nel\u180emvs\u200bzwsp",
  "control\u0001chars\u007fdel\u001bescape\u000bvt\u000cff",
  "punctuation!!! ??? ... --- *** ### @@@ ((( ))) []{}<>",
  "code: for (int i = 0; i < n; i++) { x[i] += y[i] * 2; }\n    return x;",
  "def f(x):\n    return x ** 2  # comment\n\n\nprint(f(3))",
  "<html><body class=\"main\">Hello &amp; welcome</body></html>",
  "path/to/file.txt C:\\Windows\\System32 https://example.com/a?b=c&d=e#f",
  "mixed漢字and English混合text123数字",
  "it'ſ Kelvin K test 'Ś 'ſ",
  "ǅemal ǈudevit ᾈ titlecase Ǆ",
  "Aʰʲ modifier ʰello ˈstress",
  "x\n\ny\n \nz \n",
  " \n",
  "\n\n\n",
  "a",
  " ",
  "",
  "!",
  "'s",
  " 's 'S 't 're 've 'm 'll 'd 'x",
  "hello\r\n\r\nworld\r",
  "中文，English，混合。",
  "ぁ゙゚ゝゞ",
  "𠀀𠀁 𪜀 𫝀 CJK ext B-E",
  "ℵ ℶ ∑ ∫ √ ∞ ≠ ≤ ≥ ± × ÷",
  "$100 €50 £30 ¥1000 ₹500",
  "test@example.com user_name123",
  "   leading and trailing   ",
  "A.B.C. U.S.A. e.g. i.e.",
  "Ünïcödé ÀÉÎÕÜ àéîõü ßẞ",
  "1st 2nd 3rd 4th 100th",
  "\u0000nul\u0000byte",
];

function splitWith(pat, text) {
  const bytes = Buffer.from(text, "utf8");
  const set = new Set();
  for (let i = 0; i < bytes.length; i++)
    for (let j = i + 2; j <= bytes.length; j++) set.add(bytes.subarray(i, j).toString("base64"));
  const lines = [];
  for (let b = 0; b < 256; b++) lines.push(Buffer.from([b]).toString("base64") + " " + b);
  let rank = 256;
  for (const s of set) lines.push(s + " " + rank++);
  const enc = new Tiktoken(lines.join("\n"), {}, pat);
  const ids = enc.encode_ordinary(text);
  const pieces = Array.from(ids).map((id) => Buffer.from(enc.decode_single_token_bytes(id)).toString("utf8"));
  enc.free();
  if (pieces.join("") !== text) throw new Error("pieces do not add up for " + JSON.stringify(text));
  return pieces;
}

const splits = {};
for (const [name, pat] of Object.entries(patterns)) splits[name] = texts.map((t) => ({ text: t, pieces: splitWith(pat, t) }));

// Kimi's tokenizer over the kimi_a fixture
const root = path.resolve(__dirname, "..", "..", "..");
const fix = path.join(root, "tests", "fixtures", "kimi_a");
const ranksText = fs.readFileSync(path.join(fix, "tiktoken.model"), "utf8");
const nRanks = ranksText.split("\n").filter((l) => l.trim()).length;
const cfg = JSON.parse(fs.readFileSync(path.join(fix, "tokenizer_config.json"), "utf8"));
const specials = {};
for (let id = nRanks; id < nRanks + 256 + 2; id++) {
  const named = cfg.added_tokens_decoder && cfg.added_tokens_decoder[String(id)];
  specials[named ? named.content : `<|reserved_token_${id}|>`] = id;
}
const kimi = new Tiktoken(ranksText, specials, patterns["kimi-k2"]);
const kimiTexts = texts.concat([
  "getUserName iPhone helloWorld HTTPServer e\u0301 a\u0308 नमस्ते 漢字々〆〇 1〇2 世界。你好，",
  "ǅemal Aʰʲ x\u200by 日本語のテキスト ÀÉÎ àéî 'S 'll a\u00a0b\u3000c",
  "<|im_user|>user<|im_middle|>Tell me about the french revolution.<|im_end|><|im_assistant|>assistant<|im_middle|>",
  "<|im_system|>system<|im_middle|>You are helpful.<|im_end|>",
  "[BOS]text[EOS] [EOT]<|im_end|><|im_end|>x<|reserved_token_500|>",
  "<|im_end| <|im_end|><| im_end|>",
]);
const kimiIds = kimiTexts.map((t) => ({ text: t, ids: Array.from(kimi.encode(t, "all")) }));
kimi.free();

// ---- the probe vocabulary: greedy byte-level BPE over the texts (specials cut out) ----
const seedStrings = [
  "getUserName", "iPhone helloWorld", "HTTPServer", "e\u0301 a\u0308", "नमस्ते", "漢字々〆〇", "1〇2",
  "世界。", "你好，", "ǅemal", "Aʰʲ", "x\u200by", "日本語のテキスト", "ÀÉÎ àéî", "'S 'll", "a\u00a0b\u3000c",
];
function trainProbe(corpus, nRanks) {
  const tokens = []; // rank -> Buffer
  const index = new Map(); // base64 -> rank
  for (let b = 0; b < 256; b++) { tokens.push(Buffer.from([b])); index.set(tokens[b].toString("base64"), b); }
  for (const str of seedStrings) {
    const chars = Array.from(str).map((c) => Buffer.from(c, "utf8"));
    for (let i = 0; i + 1 < chars.length; i++) {
      const t = Buffer.from([chars[i][chars[i].length - 1], chars[i + 1][0]]);
      const key = t.toString("base64");
      if (!index.has(key)) { index.set(key, tokens.length); tokens.push(t); }
    }
  }
  let seqs = corpus.map((t) => Array.from(Buffer.from(t, "utf8")));
  while (tokens.length < nRanks) {
    const counts = new Map();
    for (const s of seqs) for (let i = 0; i + 1 < s.length; i++) {
      const k = s[i] * 65536 + s[i + 1];
      counts.set(k, (counts.get(k) || 0) + 1);
    }
    let best = -1, bestCount = 0;
    for (const [k, c] of counts) if (c > bestCount || (c === bestCount && k < best)) { best = k; bestCount = c; }
    if (best < 0) break;
    const a = Math.floor(best / 65536), b = best % 65536;
    const bytes = Buffer.concat([tokens[a], tokens[b]]);
    const key = bytes.toString("base64");
    let id = index.get(key);
    if (id === undefined) { id = tokens.length; tokens.push(bytes); index.set(key, id); }
    seqs = seqs.map((s) => {
      const out = [];
      for (let i = 0; i < s.length; i++) {
        if (i + 1 < s.length && s[i] === a && s[i + 1] === b) { out.push(id); i++; } else out.push(s[i]);
      }
      return out;
    });
  }
  return tokens.map((t, r) => t.toString("base64") + " " + r).join("\n") + "\n";
}
const specialRe = new RegExp(Object.keys(specials).map((s) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("|"), "g");
const corpus = [];
for (const t of kimiTexts) for (const part of t.split(specialRe)) if (part) corpus.push(part);
const probeRanks = trainProbe(corpus, nRanks);
fs.writeFileSync(path.join(__dirname, "probe.tiktoken"), probeRanks);
const probe = new Tiktoken(probeRanks, specials, patterns["kimi-k2"]);
const probeIds = kimiTexts.map((t) => ({ text: t, ids: Array.from(probe.encode(t, "all")) }));
probe.free();

process.stdout.write(JSON.stringify({
  generator: "tests/data/text/gen_tiktoken_ref.cjs with npm tiktoken " + JSON.parse(fs.readFileSync(path.join(path.dirname(require.resolve("tiktoken/lite")), "..", "package.json"), "utf8")).version,
  patterns, splits, kimi_a: { n_ranks: nRanks, specials_first: nRanks, tests: kimiIds },
  probe: { ranks_file: "tests/data/text/probe.tiktoken", n_ranks: nRanks, tests: probeIds },
}, null, 1) + "\n");
