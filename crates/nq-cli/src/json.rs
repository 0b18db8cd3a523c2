//! The reader of the `json` notation, `{"n":4,"rows":[1,3,0,2]}`, that `nq
//! verify` hands to [`nq_core::notation::parse`]: nq-core depends on std only and
//! leaves JSON to its callers.
//!
//! It accepts free spacing, the keys in either order, and no `n` (the caller
//! then takes the length of `rows`). It refuses unknown keys rather than
//! skipping them, so that, say, the output of `nq count --json` fed to `nq
//! verify` by mistake is named for what it is instead of misread; a key given
//! twice; and rows or an `n` that are not whole numbers in range. Every
//! refusal is a [`ParseErrorKind`], to which [`nq_core::notation::parse`] adds the line
//! and the notation's form.

use std::fmt;

use nq_core::notation::ParseErrorKind;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::error::Category;

/// Reads one `json` line: the `n` it gives, if any, and its rows. A
/// [`nq_core::notation::JsonReader`].
pub(crate) fn read(line: &str) -> Result<(Option<u64>, Vec<u32>), ParseErrorKind> {
    let mut problem = None;
    let mut de = serde_json::Deserializer::from_str(line);
    let object = Object {
        problem: &mut problem,
    }
    .deserialize(&mut de)
    .and_then(|object| de.end().map(|()| object));
    let (n, rows) = match object {
        Ok(object) => object,
        // What the visitor named is more precise than serde_json's words.
        Err(e) => return Err(problem.unwrap_or_else(|| syntax(line, &e))),
    };
    let rows = rows.ok_or(ParseErrorKind::Missing {
        expected: "the key \"rows\"",
    })?;
    if rows.is_empty() {
        return Err(ParseErrorKind::Empty);
    }
    Ok((n, rows))
}

/// A serde_json error that no visitor named, said the way nq-core's readers
/// say theirs: what is wrong, at a 1-based character position.
fn syntax(line: &str, e: &serde_json::Error) -> ParseErrorKind {
    // serde_json counts columns in bytes from 1, and points at the byte where
    // it gave up; a line of the notation is one line.
    let at = e.column().saturating_sub(1);
    let position = line.char_indices().take_while(|&(i, _)| i < at).count() + 1;
    let message = e.to_string();
    // Its messages end with " at line L column C", said here as a position.
    let problem = message
        .rsplit_once(" at line ")
        .map_or(message.as_str(), |(problem, _)| problem);
    match e.classify() {
        Category::Syntax if problem == "trailing characters" => {
            ParseErrorKind::Trailing { position }
        }
        // serde_json points at the last byte; the line ends after it.
        Category::Eof => ParseErrorKind::JsonSyntax {
            problem: problem.replacen("EOF while parsing", "the line ends inside", 1),
            position: line.chars().count() + 1,
        },
        _ => ParseErrorKind::JsonSyntax {
            problem: problem.to_string(),
            position,
        },
    }
}

/// Records `kind` for [`read`] and fails the deserialisation; the message
/// given to serde is never shown, since [`read`] reports `kind` instead.
fn fail<E: de::Error>(slot: &mut Option<ParseErrorKind>, kind: ParseErrorKind) -> E {
    *slot = Some(kind);
    E::custom("a problem recorded for nq")
}

/// A row, or `n`, that is not a whole number in range: its JSON text.
fn bad_number(v: &Value) -> ParseErrorKind {
    ParseErrorKind::BadRow {
        token: shorten(&v.to_string()),
    }
}

/// A token for an error message, cut to a readable length, as nq-core cuts
/// the tokens of the other notations.
fn shorten(token: &str) -> String {
    const MAX: usize = 24;
    match token.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &token[..i]),
        None => token.to_string(),
    }
}

/// The object: `n` if given, and `rows` if given (its absence is reported by
/// [`read`], after the whole object has been read).
struct Object<'p> {
    problem: &'p mut Option<ParseErrorKind>,
}

impl<'de> DeserializeSeed<'de> for Object<'_> {
    type Value = (Option<u64>, Option<Vec<u32>>);

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        d: D,
    ) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Object<'_> {
    type Value = (Option<u64>, Option<Vec<u32>>);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object with the keys \"n\" and \"rows\"")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut n, mut rows) = (None, None);
        while let Some(key) = map.next_key::<String>()? {
            let duplicate = match key.as_str() {
                "n" => {
                    let v: Value = map.next_value()?;
                    let Some(value) = v.as_u64() else {
                        return Err(fail(self.problem, bad_number(&v)));
                    };
                    n.replace(value).is_some()
                }
                "rows" => {
                    let value = map.next_value_seed(Rows {
                        problem: &mut *self.problem,
                    })?;
                    rows.replace(value).is_some()
                }
                _ => {
                    let key = shorten(&key);
                    let kind = ParseErrorKind::JsonKey {
                        key,
                        duplicate: false,
                    };
                    return Err(fail(self.problem, kind));
                }
            };
            if duplicate {
                let kind = ParseErrorKind::JsonKey {
                    key,
                    duplicate: true,
                };
                return Err(fail(self.problem, kind));
            }
        }
        Ok((n, rows))
    }
}

/// The value of `rows`: an array of whole numbers that fit a `u32`.
struct Rows<'p> {
    problem: &'p mut Option<ParseErrorKind>,
}

impl<'de> DeserializeSeed<'de> for Rows<'_> {
    type Value = Vec<u32>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Vec<u32>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Rows<'_> {
    type Value = Vec<u32>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"rows\" to be an array of rows like [1,3,0,2]")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u32>, A::Error> {
        let mut rows = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(v) = seq.next_element::<Value>()? {
            match v.as_u64().and_then(|r| u32::try_from(r).ok()) {
                Some(row) => rows.push(row),
                None => return Err(fail(self.problem, bad_number(&v))),
            }
        }
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;

    use nq_core::notation::{
        Entry, Format, ParseError, parse, to_string, write_solution,
    };
    use nq_core::{Board, Prefix, search};

    use super::*;

    const FOUR: [u32; 4] = [1, 3, 0, 2];

    fn only(text: &str) -> Entry {
        let mut all: Vec<_> = parse(text, read).collect();
        assert_eq!(all.len(), 1, "{text:?} → {all:?}");
        all.remove(0).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    fn error(text: &str) -> ParseError {
        let mut all: Vec<_> = parse(text, read).collect();
        assert_eq!(all.len(), 1, "{text:?} → {all:?}");
        all.remove(0).expect_err(text)
    }

    #[test]
    fn every_solution_round_trips() {
        for n in 1..=8u64 {
            let board = Board::new(n).unwrap();
            let mut solutions: Vec<Vec<u8>> = vec![];
            search::search(&Prefix::empty(board), &mut |rows: &[u8]| {
                solutions.push(rows.to_vec());
                ControlFlow::Continue(())
            });
            // One text holding every solution, as `nq solutions -f json` writes it.
            let mut text = String::new();
            for rows in &solutions {
                write_solution(&mut text, Format::Json, rows).unwrap();
            }
            let back: Vec<Entry> = parse(&text, read)
                .collect::<Result<_, _>>()
                .unwrap_or_else(|e| panic!("n={n}: {e}\n{text}"));
            assert_eq!(back.len(), solutions.len(), "n={n}");
            for (entry, rows) in back.iter().zip(&solutions) {
                assert_eq!((entry.format, entry.n), (Format::Json, n));
                let want: Vec<u32> = rows.iter().map(|&r| r.into()).collect();
                assert_eq!(entry.rows, want, "n={n}");
            }
        }
    }

    #[test]
    fn json_mixes_with_the_other_notations() {
        let text =
            "# a comment\n[1 3 0 2]\n  {\"rows\": [1, 3, 0, 2], \"n\": 4}  \n2413\n";
        let entries: Vec<Entry> = parse(text, read).collect::<Result<_, _>>().unwrap();
        let got: Vec<(usize, Format)> =
            entries.iter().map(|e| (e.line, e.format)).collect();
        assert_eq!(
            got,
            [(2, Format::Vector), (3, Format::Json), (4, Format::Digits)]
        );
        assert!(entries.iter().all(|e| e.rows == FOUR && e.n == 4));
    }

    #[test]
    fn the_reader_is_liberal_where_documented() {
        let j = only("{\"rows\":[1,3,0,2]}");
        assert_eq!(
            (j.n, j.rows),
            (4, FOUR.to_vec()),
            "n defaults to the length"
        );
        assert_eq!(
            only("{ \"rows\" : [ 1 , 3 , 0 , 2 ] , \"n\" : 4 }").rows,
            FOUR
        );
        // The reader keeps what the verifier must judge.
        let j = only("{\"n\":5,\"rows\":[1,3,0,2]}");
        assert_eq!(j.n, 5);
        assert_eq!(only("{\"rows\":[0,0,9]}").rows, [0, 0, 9]);
        assert_eq!(only("{\"rows\":[4294967295]}").rows, [u32::MAX]);
    }

    #[test]
    fn errors_name_the_problem_and_the_expected_form() {
        let cases: &[(&str, &str)] = &[
            ("{\"n\":4}", "missing the key \"rows\""),
            ("{}", "missing the key \"rows\""),
            ("{\"rows\":[]}", "no columns"),
            ("{\"rows\":[1],\"x\":2}", "unknown key \"x\""),
            ("{\"rows\":[1],\"rows\":[1]}", "key \"rows\" is given twice"),
            ("{\"n\":4,\"n\":4,\"rows\":[1]}", "key \"n\" is given twice"),
            ("{\"rows\":[1,]}", "trailing comma at character 12"),
            ("{\"rows\":[1.5]}", "`1.5` is not a row"),
            ("{\"rows\":[-3]}", "`-3` is not a row"),
            ("{\"rows\":[\"3\"]}", "`\"3\"` is not a row"),
            ("{\"rows\":[99999999999]}", "`99999999999` is not a row"),
            ("{\"n\":-4,\"rows\":[1]}", "`-4` is not a row"),
            ("{\"rows\":3}", "\"rows\" to be an array"),
            ("{\"rows\":[1] x", "expected `,` or `}` at character 13"),
            (
                "{\"rows\":[1]",
                "the line ends inside an object at character 12",
            ),
            ("{\"rows\":[1", "the line ends inside a list"),
            (
                "{\"rows\":[1]} x",
                "unexpected text after the solution at character 14",
            ),
            ("{rows:[1]}", "key must be a string at character 2"),
        ];
        for (text, want) in cases {
            let e = error(text);
            assert_eq!((e.line(), e.format()), (1, Some(Format::Json)), "{text:?}");
            let msg = e.to_string();
            assert!(msg.contains(want), "{text:?}: {msg}");
            assert!(
                msg.contains(Format::Json.form()),
                "{text:?} names the form: {msg}"
            );
        }
        // A position counts characters, not bytes.
        let e = error("{\"rows\":[1],\"é\":2} x");
        assert!(e.to_string().contains("unknown key \"é\""), "{e}");
        let e = error("{\"n\":4,\"rows\":[1]}é");
        assert!(e.to_string().contains("at character 19"), "{e}");
    }

    #[test]
    fn a_million_columns_read_in_linear_time() {
        // A permutation (valid or not is irrelevant here) of a million rows.
        let n = 1_000_000u32;
        let rows: Vec<u32> = (0..n).map(|c| (c * 7 + 3) % n).collect();
        let text = to_string(Format::Json, &rows).unwrap();
        assert_eq!(only(&text).rows, rows);
    }
}
