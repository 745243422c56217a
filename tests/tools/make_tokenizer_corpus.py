"""Assemble tests/data/tokenizer_corpus.txt, the text the tokenizer goldens are computed on.

Run once by hand (any Python 3.10+); the output is committed, so tests never run this.  It takes
excerpts of files found on a development machine (CPython's standard library and C headers,
npm's JavaScript, the Apache-2.0 licence text, CPython's CJK test texts) and adds text
generated here: prose in many scripts, unicode edge cases, whitespace and digit runs, URLs,
special-token strings, and seeded random mixtures of all of these.

Documents are separated by a line holding only DOC_SEPARATOR.
"""

from __future__ import annotations

import glob
import os
import random
import sys
import sysconfig
import unicodedata

DOC_SEPARATOR = "\u241e\u241e\u241e goinfer-doc \u241e\u241e\u241e"  # ␞␞␞ goinfer-doc ␞␞␞
OUT = os.path.join(os.path.dirname(__file__), "..", "data", "tokenizer_corpus.txt")
rng = random.Random(20250611)
docs: list[str] = []


def add(text: str) -> None:
    text = text.replace(DOC_SEPARATOR, "")
    if text:
        docs.append(text)


def chunks(text: str, size: int, limit: int) -> list[str]:
    """Up to `limit` chunks of about `size` characters, cut at line ends."""
    out, cur = [], []
    n = 0
    for line in text.splitlines(keepends=True):
        cur.append(line)
        n += len(line)
        if n >= size:
            out.append("".join(cur))
            cur, n = [], 0
            if len(out) >= limit:
                break
    if cur and len(out) < limit:
        out.append("".join(cur))
    return out


def read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


# ---- excerpts of files on this machine ------------------------------------------------------

stdlib = sysconfig.get_paths()["stdlib"]
for name in (
    "textwrap.py",
    "json/decoder.py",
    "string.py",
    "fractions.py",
    "heapq.py",
    "base64.py",
):
    src = read(os.path.join(stdlib, name))
    if src:
        for c in chunks(src, 2500, 3):
            add(c)

include = sysconfig.get_paths()["include"]
for name in ("object.h", "unicodeobject.h", "listobject.h", "pymacro.h"):
    src = read(os.path.join(include, name))
    if src:
        for c in chunks(src, 2500, 2):
            add(c)

for path in sorted(glob.glob("/usr/lib/node_modules/npm/lib/*.js"))[:4]:
    src = read(path)
    if src:
        for c in chunks(src, 2500, 2):
            add(c)

lic = read("/usr/share/common-licenses/Apache-2.0")
if lic:
    for c in chunks(lic, 3000, 4):
        add(c)

cjk = os.path.join(stdlib, "test", "cjkencodings")
for name in (
    "gb2312-utf8.txt",
    "euc_jp-utf8.txt",
    "big5-utf8.txt",
    "cp949-utf8.txt",
    "johab-utf8.txt",
):
    src = read(os.path.join(cjk, name))
    if src:
        add(src)

# ---- generated: prose in many scripts --------------------------------------------------------

PROSE = [
    (
        "The quick brown fox jumps over the lazy dog. It's what they'd've done, isn't it? "
        "We'll see; you're right, I'm sure. THEY'RE HERE. Don't, won't, can't, shan't."
    ),
    (
        "Le petit prince s'est assis sur une pierre et a levé les yeux vers le ciel. « Où sont "
        "les hommes ? » demanda-t-il. Ça m'a fait réfléchir à l'été dernier, à Noël, à la forêt."
    ),
    (
        "Über den Wolken muss die Freiheit wohl grenzenlos sein. Die Straße ist nass; "
        "Größenordnungen, Fußgänger und Äpfel fallen nicht weit vom Stamm."
    ),
    (
        "El niño comió piña en la mañana. ¿Dónde está la biblioteca? ¡Qué día tan bonito! "
        "Los pingüinos no vuelan, pero nadan muy rápido."
    ),
    (
        "Съешь же ещё этих мягких французских булок, да выпей чаю. Москва — столица России; ёлка, щука, объём и подъезд."
    ),
    "Ταχίστη αλώπηξ βαφής ψημένη γη, δρασκελίζει υπέρ νωθρού κυνός. Ἐν ἀρχῇ ἦν ὁ λόγος.",
    "العربية لغة جميلة. مرحبًا بكم في عالم الحوسبة! هذا نصٌّ قصيرٌ مع تشكيلٍ كاملٍ، وأرقام ١٢٣٤٥.",
    "עברית נכתבת מימין לשמאל. שָׁלוֹם עֲלֵיכֶם! המספר 42 נשאר משמאל לימין.",
    "हिन्दी भारत की एक भाषा है। नमस्ते, आप कैसे हैं? संख्याएँ: १२३४५६७८९०.",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ สวัสดีครับ ยินดีต้อนรับ",
    "Tiếng Việt có nhiều dấu: Trường học, người Việt, chữ quốc ngữ, phở bò rất ngon.",
    "Türkçe: Iğdır'da ılık bir gün; İstanbul'un şehir hatları vapurları çok güzeldir.",
    "Zażółć gęślą jaźń. Pchnąć w tę łódź jeża lub ośm skrzyń fig.",
    "日本語の文章には漢字、ひらがな、カタカナが混ざります。東京スカイツリーは６３４メートルです。",
    "中文没有空格。我们今天去北京大学参观，然后吃了北京烤鸭。价格：１２８元。",
    "한국어는 띄어쓰기를 합니다. 서울특별시는 대한민국의 수도입니다. 감사합니다!",
    "Ελληνικά και English mixed με 日本語 and العربية in one line: résumé, naïve, coöperate.",
    "Íslenska: Þetta er ævintýri; Færeyskt: Ðað. Norsk: blåbærsyltetøy. Suomi: hyvää päivää.",
    "ქართული ენა ძალიან ლამაზია. Հայերեն լեզու. አማርኛ ቋንቋ። ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ.",
    "தமிழ் மொழி மிகவும் பழமையானது. తెలుగు భాష. ಕನ್ನಡ ಭಾಷೆ. മലയാളം. বাংলা ভাষা. ਪੰਜਾਬੀ.",
]
for p in PROSE:
    add(p + "\n")
add("\n\n".join(PROSE))

# ---- generated: unicode edge cases -----------------------------------------------------------

EMOJI = [
    "😀",
    "😂",
    "🥲",
    "👍",
    "👍🏽",
    "👍🏿",
    "👨‍👩‍👧‍👦",
    "👩‍💻",
    "🧑🏾‍🚀",
    "🏳️‍🌈",
    "🏴‍☠️",
    "❤️",
    "❤️‍🔥",
    "🇫🇷",
    "🇯🇵",
    "🇺🇸",
    "🇧🇷",
    "🇪🇺",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿",
    "1️⃣",
    "#️⃣",
    "*️⃣",
    "©️",
    "™",
    "☺︎",
    "🫠",
    "🐍",
    "🦀",
]
add(" ".join(EMOJI) + "\n" + "".join(EMOJI) + "\n" + "x".join(EMOJI) + "\n")
COMBINING = [
    "e\u0301",
    "a\u0308",
    "n\u0303",
    "o\u0302\u0323",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319",
    "\u1100\u1161\u11a8",
    "\u0915\u094d\u0937",
    "A\u030a",
    "\u00c5",
    "\u212b",
    "ﬁ",
    "ﬀ",
    "ǅ",
    "İ",
    "ß",
    "ẞ",
]
add("Combining: " + " ".join(COMBINING) + "\n" + "".join(COMBINING) + "\n")
add(
    "NFC "
    + unicodedata.normalize("NFC", "".join(COMBINING))
    + " NFD "
    + unicodedata.normalize("NFD", "café Å ﬁ")
    + "\n"
)
add(
    "Zero width: a\u200bb a\u200cb a\u200db a\u2060b \ufeffBOM here, soft\u00adhyphen, "
    "rtl \u202eabc\u202c \u200fmark\u200e, nbsp\u00a0here, narrow\u202fnbsp, ideographic\u3000space, "
    "em\u2003space, thin\u2009space, line\u2028sep, para\u2029sep, nel\u0085x, vt\x0bff\x0cend\n"
)
add(
    "Symbols: ∀x∈ℝ: x²≥0, ∑ᵢ aᵢ = ∫₀^∞ f(x) dx ≈ 3.14159… ½ ¼ ¾ ⅓ → ⇒ ⟹ ≠ ≤ ≥ ± × ÷ √ ∞ µ Ω ℃ ‰ "
    "€ £ ¥ ₹ ₩ ₿ § ¶ † ‡ • ‣ ◊ ♠ ♣ ♥ ♦ ♪ ♫ ☃ ☂ ✓ ✗ ✔ ✘ ★ ☆ ⌘ ⌥ ⇧ ⏎ ␣\n"
    "Box: ┌──┬──┐\n│ab│cd│\n├──┼──┤\n└──┴──┘\n Braille ⠓⠑⠇⠇⠕ Runes ᚠᚢᚦᚨᚱᚲ Math 𝔸𝕓𝒸𝓭𝐞𝑓 𝟘𝟙𝟚\n"
    "Fullwidth: ＡＢＣ ａｂｃ ０１２３ ！？（）　Halfwidth: ｶﾀｶﾅ\n"
)

# ---- generated: whitespace, digits, numbers ---------------------------------------------------

add("\n\n3")
add("\n\n3\n\n33\n\n333 \n\n 3\n\n\n3.5\n\n-3")
add(
    "a  b   c    d     e      f\n"
    + " " * 40
    + "x\n"
    + "\t" * 5
    + "y\n"
    + " \t \t  \t\n"
    + "\n" * 35
    + "z"
)
add("trailing spaces   \ntrailing tab\t\n\r\nwindows\r\nline\r\nends\r\n\r\n\r\nmac\rstyle\r")
add("   leading spaces and trailing   ")
add("\n")
add(" ")
add("\t\t\t")
nums = [
    "0",
    "7",
    "42",
    "123",
    "1234",
    "12345",
    "123456",
    "1234567",
    "12345678901234567890",
    "3.14159",
    "2.718281828",
    "-0.5",
    "+1e10",
    "6.022e23",
    "1,000,000",
    "1.000.000,50",
    "1_000_000",
    "0xDEADBEEF",
    "0b1010",
    "0o755",
    "1/2",
    "3:45pm",
    "2024-02-29",
    "12:34:56.789",
    "v1.2.3-rc.4",
    "192.168.0.1",
    "::1",
    "+1 (555) 123-4567",
    "100%",
    "$19.99",
    "€5,00",
    "٣٤٥",
    "१२३",
    "１２３",
    "²³¹",
    "Ⅻ",
    "⑦",
    "½",
]
add(" ".join(nums) + "\n" + "".join(nums) + "\n" + "\n".join(nums) + "\n")
add("".join(str(rng.randrange(10)) for _ in range(300)) + "\n")
add("Digits after text: abc123def456 x1y2z3 H2O CO2 3D 4K 1st 2nd 3rd 4th 10x 0day\n")

# ---- generated: URLs, markup, data ------------------------------------------------------------

add(
    "Visit https://example.com/path/to/page?query=1&lang=en#section-2 or http://localhost:8080/api/v1/"
    "items/42.json; mail someone@example.org; ftp://ftp.example.net/pub/file.tar.gz\n"
    "file:///home/user/My%20Documents/report(final).pdf C:\\Users\\Public\\Desktop\\notes.txt "
    "~/.config/goinfer/settings.toml ../../etc/passwd\n"
    "Markdown: **bold** _italic_ `code` [link](https://x.y/z) ![img](a.png) > quote\n- item\n  - nested\n"
    "1. first\n2. second\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```python\nprint('hi')\n```\n"
)
add(
    '<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><title>Test &amp; more</title></head>\n'
    "<body>\n<h1>Header</h1>\n<table><caption>Data</caption><thead><tr><th>Name</th><th>Value</th></tr>"
    "</thead>\n<tbody><tr><td>α</td><td>1</td></tr><tr><td>β</td><td>2</td></tr></tbody></table>\n"
    "<p>Some <strong>bold</strong>, <em>em</em>, <b>b</b>, <i>i</i>, <u>u</u>, <s>s</s>, <sub>2</sub>, "
    "<sup>3</sup>, <code>x = 1</code></p>\n<ul><li>one</li><li>two</li></ul>\n<div><span>x</span>"
    '<a href="/">home</a><img src="a.png"></div>\n<blockquote>quote</blockquote>\n</body>\n</html>\n'
)
add(
    '{"name": "goinfer", "version": "0.1.0", "nested": {"list": [1, 2.5, -3e-7, true, false, null], '
    '"unicode": "\\u00e9\\ud83d\\ude00", "escaped": "line\\nbreak\\ttab \\"quoted\\""}, "empty": {}}\n'
    "key: value\nlist:\n  - a\n  - b: c\n[section]\nopt = 'x'\n<?xml version=\"1.0\"?><root attr='1'><child/></root>\n"
)
add(
    "SELECT u.id, COUNT(*) AS n FROM users u LEFT JOIN orders o ON o.user_id = u.id WHERE u.created_at > "
    "'2024-01-01' GROUP BY u.id HAVING n >= 3 ORDER BY n DESC LIMIT 10;\n"
    "$ ls -la | grep -E '^d' && echo \"done\" || exit 1\nfor i in $(seq 1 10); do echo $i; done\n"
    '#include <stdio.h>\nint main(void) { printf("%d\\n", 42); return 0; }\n'
    'fn main() { let v: Vec<u8> = vec![1, 2, 3]; println!("{:?}", v); }\n'
    "const f = async (x) => { await x?.y ?? 0; return `t=${x}`; };\n"
)

# ---- generated: special-token strings inside text ------------------------------------------------

SPECIALS = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<repo_name>",
    "<file_sep>",
    "<jupyter_code>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<bos>",
    "<eos>",
    "<pad>",
    "<unk>",
    "<mask>",
    "<unused0>",
    "<unused42>",
    "[multimodal]",
    "<start_of_image>",
    "<end_of_image>",
    "<s>",
    "</s>",
    "<|eot_id|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "[INST]",
    "[/INST]",
]
add(
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    "<|im_start|>assistant\n4<|im_end|>\n<|endoftext|>"
)
add(
    "<bos><start_of_turn>user\nHello there!<end_of_turn>\n<start_of_turn>model\nHi! How can I help?"
    "<end_of_turn>\n<start_of_turn>user\n<start_of_image> describe [multimodal] <end_of_image><end_of_turn>\n"
)
add(
    "Partial specials: <|im_start <|im_start| |im_start|> <im_start> < |im_end| > <start_of_turn "
    "<end_of_turn>> <<bos>> <eos><eos><eos> <unused> <unused999999> <s> </s> <S> text<pad>text"
)
add("".join(SPECIALS) + "\n" + " ".join(SPECIALS) + "\n" + "\n".join(SPECIALS))

# ---- generated: seeded random mixtures -----------------------------------------------------------

POOL = (
    [w for p in PROSE for w in p.split()]
    + EMOJI
    + COMBINING
    + nums
    + SPECIALS
    + [
        " ",
        "  ",
        "   ",
        "\t",
        "\n",
        "\n\n",
        "\r\n",
        "'s",
        "'LL",
        "'ve",
        "’s",
        "--",
        "...",
        "…",
        "!!",
        "?!",
    ]
)
for _ in range(60):
    parts = []
    for _ in range(rng.randint(20, 120)):
        parts.append(rng.choice(POOL))
        r = rng.random()
        if r < 0.6:
            parts.append(" ")
        elif r < 0.7:
            parts.append("\n")
    add("".join(parts))

# random code points from chosen blocks (all assigned since Unicode 6 or earlier)
BLOCKS = [
    (0x20, 0x7E),
    (0xA0, 0x24F),
    (0x370, 0x3FF),
    (0x400, 0x4FF),
    (0x5D0, 0x5EA),
    (0x620, 0x64A),
    (0x905, 0x939),
    (0xE01, 0xE3A),
    (0x3041, 0x3096),
    (0x30A1, 0x30FA),
    (0x4E00, 0x9FA5),
    (0xAC00, 0xD7A3),
    (0x1F600, 0x1F64F),
    (0x2200, 0x22FF),
    (0x2500, 0x257F),
]
for _ in range(25):
    s = []
    for _ in range(rng.randint(50, 400)):
        lo, hi = rng.choice(BLOCKS)
        c = chr(rng.randint(lo, hi))
        if unicodedata.category(c) not in ("Cn", "Co", "Cs"):
            s.append(c)
        if rng.random() < 0.15:
            s.append(rng.choice([" ", " ", "\n", "  ", "\t"]))
    add("".join(s))

# ---- write ----------------------------------------------------------------------------------------

os.makedirs(os.path.dirname(OUT), exist_ok=True)
with open(OUT, "w", encoding="utf-8", newline="") as f:
    f.write(("\n" + DOC_SEPARATOR + "\n").join(docs))
size = os.path.getsize(OUT)
print(f"{len(docs)} documents, {size} bytes -> {os.path.normpath(OUT)}", file=sys.stderr)
