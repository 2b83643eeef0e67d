//! A reader for the small subset of XML that NCCL's topology files use: elements with
//! attributes, nested, and nothing else (no text content, no namespaces). Comments, an
//! `<?xml …?>` prolog and a `<!DOCTYPE …>` are skipped, so hand-annotated files read too.
//!
//! Hand-written rather than a dependency because the subset is this small and because every
//! element must keep its line for error messages. It never recurses, so a deeply nested or
//! hostile file cannot overflow the stack; nesting is bounded by [`MAX_DEPTH`] so the
//! recursive walk over the result is bounded too.

/// The deepest nesting accepted. Real files nest `system > cpu > pci (a few levels) > gpu >
/// nvlink`, well under ten levels.
pub(super) const MAX_DEPTH: usize = 64;

/// One element: its tag name, attributes in file order, children in file order.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Element {
    pub name: String,
    pub attributes: Vec<(String, String)>,
    pub children: Vec<Element>,
    /// 1-based line of the start tag.
    pub line: usize,
}

impl Element {
    /// The value of attribute `key`, if present.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// The children with tag `name`.
    pub fn children_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }
}

/// What is wrong with the text and on which 1-based line.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SyntaxError {
    pub line: usize,
    pub message: String,
}

/// Reads `text` into its single root element.
pub(super) fn parse(text: &str) -> Result<Element, SyntaxError> {
    let mut cursor = Cursor { text, pos: 0, line: 1 };
    // Open elements, innermost last.
    let mut open: Vec<Element> = Vec::new();
    let mut root: Option<Element> = None;
    loop {
        cursor.skip_whitespace();
        if cursor.at_end() {
            break;
        }
        let line = cursor.line;
        if cursor.starts_with("<?") {
            cursor.skip_past("?>", "an `<?` instruction")?;
        } else if cursor.starts_with("<!--") {
            cursor.skip_past("-->", "a comment")?;
        } else if cursor.starts_with("<!") {
            cursor.skip_past(">", "a `<!` declaration")?;
        } else if cursor.starts_with("</") {
            cursor.advance(2);
            let name = cursor.name();
            cursor.skip_whitespace();
            if !cursor.eat(">") {
                return Err(cursor.error(format!("the closing tag `</{name}` does not end with `>`")));
            }
            let Some(element) = open.pop() else {
                return Err(SyntaxError { line, message: format!("`</{name}>` closes nothing") });
            };
            if element.name != name {
                return Err(SyntaxError {
                    line,
                    message: format!("`</{name}>` closes `<{}>` of line {}", element.name, element.line),
                });
            }
            attach(element, &mut open, &mut root)?;
        } else if cursor.starts_with("<") {
            cursor.advance(1);
            let (element, closed) = start_tag(&mut cursor, line)?;
            if root.is_some() && open.is_empty() {
                return Err(SyntaxError {
                    line,
                    message: format!("`<{}>` after the end of the root element", element.name),
                });
            }
            if closed {
                attach(element, &mut open, &mut root)?;
            } else if open.len() >= MAX_DEPTH {
                return Err(SyntaxError { line, message: format!("elements nested more than {MAX_DEPTH} deep") });
            } else {
                open.push(element);
            }
        } else {
            let stray: String = cursor.rest().chars().take(20).take_while(|&c| c != '<' && c != '\n').collect();
            return Err(cursor.error(format!("unexpected text `{stray}` (the format has only tags)")));
        }
    }
    if let Some(unclosed) = open.last() {
        return Err(SyntaxError {
            line: cursor.line,
            message: format!("the file ends inside `<{}>` of line {} (is it truncated?)", unclosed.name, unclosed.line),
        });
    }
    root.ok_or_else(|| SyntaxError { line: cursor.line, message: "no element in the file".into() })
}

/// Puts a finished element under its parent, or makes it the root.
fn attach(element: Element, open: &mut [Element], root: &mut Option<Element>) -> Result<(), SyntaxError> {
    match open.last_mut() {
        Some(parent) => parent.children.push(element),
        None if root.is_none() => *root = Some(element),
        None => {
            return Err(SyntaxError {
                line: element.line,
                message: format!("`<{}>` after the end of the root element", element.name),
            })
        }
    }
    Ok(())
}

/// Reads a start tag after its `<`: name and attributes up to `>` or `/>`. Returns the element
/// and whether it closed itself.
fn start_tag(cursor: &mut Cursor<'_>, line: usize) -> Result<(Element, bool), SyntaxError> {
    let name = cursor.name();
    if name.is_empty() {
        return Err(cursor.error("a `<` that starts no tag".into()));
    }
    let mut element = Element { name, attributes: Vec::new(), children: Vec::new(), line };
    loop {
        cursor.skip_whitespace();
        if cursor.eat("/>") {
            return Ok((element, true));
        }
        if cursor.eat(">") {
            return Ok((element, false));
        }
        if cursor.at_end() {
            return Err(cursor.error(format!("the file ends inside the tag `<{}` (is it truncated?)", element.name)));
        }
        let key = cursor.name();
        if key.is_empty() {
            let found = cursor.rest().chars().next().unwrap_or(' ');
            return Err(cursor.error(format!("unexpected `{found}` in the tag `<{}`", element.name)));
        }
        cursor.skip_whitespace();
        if !cursor.eat("=") {
            return Err(cursor.error(format!("attribute `{key}` of `<{}>` has no `=value`", element.name)));
        }
        cursor.skip_whitespace();
        let value = cursor.quoted().map_err(|message| cursor.error(format!("attribute `{key}`: {message}")))?;
        if element.attribute(&key).is_some() {
            return Err(cursor.error(format!("attribute `{key}` given twice in `<{}>`", element.name)));
        }
        element.attributes.push((key, unescape(&value)));
    }
}

/// Replaces the five predefined entities (NCCL writes none, but an editor might).
fn unescape(value: &str) -> String {
    if !value.contains('&') {
        return value.to_string();
    }
    value.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&apos;", "'").replace("&amp;", "&")
}

/// A position in the text that keeps its line number as it moves.
struct Cursor<'t> {
    text: &'t str,
    pos: usize,
    line: usize,
}

impl<'t> Cursor<'t> {
    fn rest(&self) -> &'t str {
        &self.text[self.pos..]
    }
    fn at_end(&self) -> bool {
        self.pos >= self.text.len()
    }
    fn starts_with(&self, prefix: &str) -> bool {
        self.rest().starts_with(prefix)
    }
    /// Moves `bytes` forward; callers only pass lengths of ASCII they have just matched, or
    /// lengths found by searching, so `pos` stays on a character boundary.
    fn advance(&mut self, bytes: usize) {
        let end = (self.pos + bytes).min(self.text.len());
        self.line += self.text[self.pos..end].bytes().filter(|&b| b == b'\n').count();
        self.pos = end;
    }
    fn eat(&mut self, token: &str) -> bool {
        let found = self.starts_with(token);
        if found {
            self.advance(token.len());
        }
        found
    }
    fn skip_whitespace(&mut self) {
        let n = self.rest().len() - self.rest().trim_start().len();
        self.advance(n);
    }
    fn skip_past(&mut self, end: &str, what: &str) -> Result<(), SyntaxError> {
        match self.rest().find(end) {
            Some(at) => {
                self.advance(at + end.len());
                Ok(())
            }
            None => Err(self.error(format!("{what} is never closed with `{end}`"))),
        }
    }
    /// A tag or attribute name: letters, digits, `_`, `-`, `.`, `:`.
    fn name(&mut self) -> String {
        let n = self
            .rest()
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
            .unwrap_or(self.rest().len());
        let name = self.rest()[..n].to_string();
        self.advance(n);
        name
    }
    /// A value in double or single quotes.
    fn quoted(&mut self) -> Result<String, String> {
        let quote = match self.rest().chars().next() {
            Some(q @ ('"' | '\'')) => q,
            _ => return Err("the value is not in quotes".into()),
        };
        self.advance(1);
        match self.rest().find(quote) {
            Some(at) => {
                let value = self.rest()[..at].to_string();
                self.advance(at + 1);
                Ok(value)
            }
            None => Err("the value's quote is never closed (is the file truncated?)".into()),
        }
    }
    fn error(&self, message: String) -> SyntaxError {
        SyntaxError { line: self.line, message }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nested_elements_attributes_and_lines() {
        let text = "<?xml version=\"1.0\"?>\n<!-- a comment -->\n<system version=\"1\">\n  <cpu numaid='0'>\n    <pci busid=\"0000:01:00.0\"/>\n  </cpu>\n</system>\n";
        let root = parse(text).unwrap();
        assert_eq!(root.name, "system");
        assert_eq!(root.attribute("version"), Some("1"));
        assert_eq!(root.line, 3);
        let cpu = &root.children[0];
        assert_eq!((cpu.name.as_str(), cpu.attribute("numaid"), cpu.line), ("cpu", Some("0"), 4));
        assert_eq!(cpu.children[0].attribute("busid"), Some("0000:01:00.0"));
        assert_eq!(cpu.children[0].line, 5);
    }

    #[test]
    fn malformed_text_names_the_line() {
        let cases = [
            ("<system>\n<cpu>\n</system>\n", 3, "closes `<cpu>` of line 2"),
            ("<system>\n<cpu numaid=\"0\">\n", 3, "ends inside `<cpu>` of line 2"),
            ("<system>\n<cpu numaid=\"0", 2, "never closed"),
            ("<system>\n<cpu numaid=0/>\n</system>", 2, "not in quotes"),
            ("<system>\n<cpu a=\"1\" a=\"2\"/>\n</system>", 2, "given twice"),
            ("<system>\nhello\n</system>", 2, "unexpected text `hello`"),
            ("<system/>\n<system/>", 2, "after the end of the root"),
            ("</system>", 1, "closes nothing"),
            ("<!-- open", 1, "never closed"),
            ("", 1, "no element"),
            ("<system><cpu", 1, "ends inside the tag"),
            ("<system>< cpu/></system>", 1, "starts no tag"),
        ];
        for (text, line, message) in cases {
            let err = parse(text).unwrap_err();
            assert_eq!(err.line, line, "{text:?}: {err:?}");
            assert!(err.message.contains(message), "{text:?}: {err:?}");
        }
        let deep = "<a>".repeat(MAX_DEPTH + 1);
        assert!(parse(&deep).unwrap_err().message.contains("nested more than"));
    }
}
