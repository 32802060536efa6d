#!/usr/bin/env python3
"""Write the bundled corpus as JSONL documents (one {"text": ...} per line) to stdout.

Sources (both public domain, both Debian packages; see dev/data/README.md):
  - the King James Bible (bible-kjv-text, decoded with the `bible` program of bible-kjv):
    one document per chapter, "Book C" heading then one verse per line ("V text");
  - the Jargon File 4.4.7 (jargon-text): paragraphs grouped into documents of about 3000 chars.
Usage: bundled_corpus.py KJV_VERSES_TXT JARGON_TXT > corpus.jsonl
where KJV_VERSES_TXT is `bible -f gen1:1-rev22:21` output ("Ge1:1 In the beginning ...").
"""
import json
import re
import sys

BOOKS = ["Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth",
         "1 Samuel", "2 Samuel", "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra",
         "Nehemiah", "Esther", "Job", "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon",
         "Isaiah", "Jeremiah", "Lamentations", "Ezekiel", "Daniel", "Hosea", "Joel", "Amos",
         "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah", "Haggai", "Zechariah",
         "Malachi", "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians",
         "2 Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians",
         "1 Thessalonians", "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus", "Philemon",
         "Hebrews", "James", "1 Peter", "2 Peter", "1 John", "2 John", "3 John", "Jude",
         "Revelation"]


def kjv_documents(path):
    """One document per chapter; the book changes when the abbreviation changes."""
    verse = re.compile(r"^(\S+?)(\d+):(\d+) (.*)$")
    docs, book, lines, key = [], -1, [], None
    with open(path, encoding="utf-8") as f:
        for raw in f:
            m = verse.match(raw.rstrip("\n"))
            if not m:
                continue
            abbrev, chapter, number, text = m.group(1), int(m.group(2)), m.group(3), m.group(4)
            if key is None or key[0] != abbrev or key[1] != chapter:
                if lines:
                    docs.append("\n".join(lines) + "\n")
                if key is None or key[0] != abbrev:
                    book += 1
                key, lines = (abbrev, chapter), ["%s %d" % (BOOKS[book], chapter), ""]
            lines.append("%s %s" % (number, text.strip()))
    if lines:
        docs.append("\n".join(lines) + "\n")
    assert book == len(BOOKS) - 1, "expected 66 books, got %d" % (book + 1)
    return docs


def jargon_documents(path, target=3000):
    """Paragraphs (blank-line separated, 3-space indent removed) grouped into ~target-char docs."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    paragraphs = [re.sub(r"(?m)^   ", "", p).strip("\n") for p in re.split(r"\n\s*\n", text)]
    docs, cur = [], []
    for p in paragraphs:
        if not p.strip():
            continue
        cur.append(p)
        if sum(len(x) for x in cur) >= target:
            docs.append("\n\n".join(cur) + "\n")
            cur = []
    if cur:
        docs.append("\n\n".join(cur) + "\n")
    return docs


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: bundled_corpus.py KJV_VERSES_TXT JARGON_TXT > corpus.jsonl")
    for doc in kjv_documents(sys.argv[1]) + jargon_documents(sys.argv[2]):
        sys.stdout.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
