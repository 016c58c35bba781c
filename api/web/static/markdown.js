// A small Markdown renderer for the page's answers, with HTML disabled by construction: it builds
// elements and text nodes only (no innerHTML, no HTML parsing), so markup in an answer (a model's,
// or a document's it quotes) shows as the text it is. It covers what answers use: paragraphs,
// headings, fenced code, lists (nested), block quotes, rules; inline code, emphasis, links (http,
// https and mailto only: a javascript: link stays text). A fence not closed yet (a stream still
// coming in) runs to the end. Citations [n] become whatever `cite(n)` returns (null: text).
"use strict";

globalThis.RaglineMarkdown = (() => {
  const FENCE = /^ {0,3}(`{3,}|~{3,})[ \t]*([^`\s]*)/;
  const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
  const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
  const ITEM = /^( *)(?:([-*+])|(\d{1,9})[.)])(?:[ \t]+(.*)|[ \t]*$)/;
  const QUOTE = /^ {0,3}>[ \t]?(.*)$/;
  const BLANK = /^[ \t]*$/;
  // Inline spans, earliest first: code, autolink, image, link, strong, emphasis, escape.
  const INLINE = new RegExp(
    [
      /(`+)([^]*?[^`])\1(?!`)/.source,
      /<((?:https?:|mailto:)[^\s<>]+)>/.source,
      /!\[([^\]\n]*)\]\(([^()\s]*)(?:\s+"[^"\n]*")?\)/.source,
      /\[([^\]\n]+)\]\(([^()\s]*)(?:\s+"[^"\n]*")?\)/.source,
      /\*\*(?=\S)([^]*?\S)\*\*|(?<![\w_])__(?=\S)([^]*?\S)__(?![\w_])/.source,
      /\*(?=[^\s*])([^*]*?[^\s*])\*|(?<![\w_])_(?=[^\s_])([^_]*?[^\s_])_(?![\w_])/.source,
      /\\([!-/:-@[-`{-~])/.source,
    ].join("|"),
    "g",
  );
  const SAFE_PROTOCOLS = new Set(["http:", "https:", "mailto:"]);

  function element(tag, ...children) {
    const node = document.createElement(tag);
    node.append(...children);
    return node;
  }

  function indentOf(line) {
    return line.length - line.trimStart().length;
  }

  function startsBlock(line) {
    return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
  }

  // The text of a span, its lines broken where the source broke them, citations as cite() says.
  function text(parent, value, cite) {
    value.split("\n").forEach((line, n) => {
      if (n) parent.append(document.createElement("br"));
      let last = 0;
      for (const match of line.matchAll(/\[(\d{1,3})\]/g)) {
        const node = cite(Number(match[1]));
        if (!node) continue;
        parent.append(line.slice(last, match.index), node);
        last = match.index + match[0].length;
      }
      parent.append(line.slice(last));
    });
  }

  function safeUrl(raw) {
    try {
      const url = new URL(raw, document.baseURI);
      return SAFE_PROTOCOLS.has(url.protocol) ? url.href : null;
    } catch {
      return null;
    }
  }

  function link(label, href, cite) {
    const url = safeUrl(href);
    if (!url) {
      const span = document.createElement("span");
      inline(span, label, cite);
      return span;
    }
    const anchor = document.createElement("a");
    anchor.href = url;
    anchor.rel = "noopener noreferrer nofollow";
    anchor.target = "_blank";
    inline(anchor, label, cite);
    return anchor;
  }

  function inline(parent, value, cite) {
    let last = 0;
    for (const m of value.matchAll(INLINE)) {
      text(parent, value.slice(last, m.index), cite);
      last = m.index + m[0].length;
      if (m[1] !== undefined) {
        parent.append(element("code", m[2].replace(/\n/g, " ")));
      } else if (m[3] !== undefined) {
        parent.append(link(m[3], m[3], cite));
      } else if (m[4] !== undefined) {
        parent.append(m[4]); // an image's alt text: nothing is loaded from an answer
      } else if (m[6] !== undefined) {
        parent.append(link(m[6], m[7], cite));
      } else if (m[8] !== undefined || m[9] !== undefined) {
        const strong = document.createElement("strong");
        inline(strong, m[8] ?? m[9], cite);
        parent.append(strong);
      } else if (m[10] !== undefined || m[11] !== undefined) {
        const em = document.createElement("em");
        inline(em, m[10] ?? m[11], cite);
        parent.append(em);
      } else {
        parent.append(m[12]);
      }
    }
    text(parent, value.slice(last), cite);
  }

  function codeBlock(lines, language) {
    const code = element("code", lines.join("\n"));
    if (language) code.className = `language-${language}`;
    return element("pre", code);
  }

  // A list from lines[i]: its items are the lines at its marker's indent; deeper lines (and a
  // paragraph's lazy continuation) belong to the item before, parsed as blocks of their own.
  function list(lines, i, cite) {
    const first = ITEM.exec(lines[i]);
    const ordered = first[3] !== undefined;
    const indent = first[1].length;
    const node = document.createElement(ordered ? "ol" : "ul");
    if (ordered && Number(first[3]) !== 1) node.start = Number(first[3]);
    while (i < lines.length) {
      const m = ITEM.exec(lines[i]);
      if (!m || m[1].length !== indent || (m[3] !== undefined) !== ordered) break;
      const content = m[0].length - (m[4] ?? "").length;
      const body = [m[4] ?? ""];
      i += 1;
      while (i < lines.length) {
        const line = lines[i];
        if (BLANK.test(line)) {
          const next = lines.slice(i + 1).find((l) => !BLANK.test(l));
          if (next === undefined || indentOf(next) <= indent) break;
          body.push("");
        } else if (indentOf(line) > indent) {
          body.push(line.slice(Math.min(indentOf(line), content)));
        } else if (!startsBlock(line) && !BLANK.test(body[body.length - 1])) {
          body.push(line); // a lazy continuation of the item's paragraph
        } else {
          break;
        }
        i += 1;
      }
      const item = document.createElement("li");
      const children = blocks(body, cite);
      // A tight item's paragraph is its text, not a paragraph of its own.
      if (children[0] && children[0].tagName === "P") children.splice(0, 1, ...children[0].childNodes);
      item.append(...children);
      node.append(item);
      while (i < lines.length && BLANK.test(lines[i])) {
        const next = lines.slice(i).find((l) => !BLANK.test(l));
        if (next === undefined || !ITEM.test(next) || indentOf(next) !== indent) return [node, i];
        i += 1;
      }
    }
    return [node, i];
  }

  function blocks(lines, cite) {
    const out = [];
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if (BLANK.test(line)) {
        i += 1;
      } else if ((m = FENCE.exec(line))) {
        const fence = m[1];
        const close = new RegExp(`^ {0,3}${fence[0]}{${fence.length},}[ \\t]*$`);
        const body = [];
        for (i += 1; i < lines.length && !close.test(lines[i]); i += 1) body.push(lines[i]);
        i += 1;
        out.push(codeBlock(body, m[2]));
      } else if ((m = HEADING.exec(line))) {
        const heading = document.createElement(`h${m[1].length}`);
        inline(heading, m[2] ?? "", cite);
        out.push(heading);
        i += 1;
      } else if (RULE.test(line)) {
        out.push(document.createElement("hr"));
        i += 1;
      } else if (QUOTE.test(line)) {
        const body = [];
        for (; i < lines.length && (m = QUOTE.exec(lines[i])); i += 1) body.push(m[1]);
        out.push(element("blockquote", ...blocks(body, cite)));
      } else if (ITEM.test(line)) {
        const [node, next] = list(lines, i, cite);
        out.push(node);
        i = next;
      } else {
        const body = [line.trim()];
        for (i += 1; i < lines.length && !BLANK.test(lines[i]) && !startsBlock(lines[i]); i += 1) {
          body.push(lines[i].trim());
        }
        const paragraph = document.createElement("p");
        inline(paragraph, body.join("\n"), cite);
        out.push(paragraph);
      }
    }
    return out;
  }

  // `text` as a fragment of elements; `cite(n)` makes citation n's node, or null to leave it text.
  function render(value, { cite = () => null } = {}) {
    const fragment = document.createDocumentFragment();
    fragment.append(...blocks(String(value).replace(/\r\n?/g, "\n").split("\n"), cite));
    return fragment;
  }

  return { render };
})();
