//! The exposition lines an analysis keeps, parsed without a parser combinator when they are in
//! the plain shape engines write: `# HELP name text`, `# TYPE name kind`, and
//! `name{k="v",…} value` with one blank before the value, no timestamp, no escapes, no blank
//! lines, every family's lines together. Anything else (or anything the parser of record
//! would refuse or assemble with an error) answers `None`, and [`super::Page::parse`] hands
//! the text to `prom_text_format_parser`, the parser of record; the tests hold this one to it
//! (the same metrics, field by field, on real-sized pages and on generated ones).
//!
//! It builds the crate's own types, assembled by the crate's rules (a family's `_bucket`,
//! `_sum`, `_count` samples by its `TYPE`), so a page reads the same whichever parsed it.

use prom_text_format_parser::{Float, Label, Labels, Metric, Sample, Type, Value, ValueType};

/// One line of the plain shape.
enum Line<'t> {
    Help {
        name: &'t str,
        desc: &'t str,
    },
    Type {
        name: &'t str,
        kind: Type,
    },
    Sample {
        name: &'t str,
        labels: Labels,
        value: &'t str,
    },
}

/// Where the family being read is: after its `HELP`, its `TYPE`, or among its samples.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Help,
    Type,
    Sample,
}

/// The family being read.
struct Open<'t> {
    name: &'t str,
    kind: Option<Type>,
    desc: Option<&'t str>,
    samples: Vec<Sample>,
    state: State,
}

impl<'t> Open<'t> {
    fn start(line: Line<'t>) -> Open<'t> {
        let mut open = Open {
            name: "",
            kind: None,
            desc: None,
            samples: Vec::new(),
            state: State::Help,
        };
        match line {
            Line::Help { name, desc } => {
                open.name = name;
                open.desc = Some(desc);
            }
            Line::Type { name, kind } => {
                open.name = name;
                open.kind = Some(kind);
                open.state = State::Type;
            }
            Line::Sample {
                name,
                labels,
                value,
            } => {
                // A family opened by a sample is untyped, and that sample a plain one.
                open.name = name;
                open.samples.push(sample(labels, value, ValueType::Sample));
                open.state = State::Sample;
            }
        }
        open
    }

    fn finish(self) -> Metric {
        Metric::new(
            self.kind.unwrap_or_default(),
            self.desc.map(str::to_owned),
            self.name.to_owned(),
            self.samples,
        )
    }
}

fn sample(labels: Labels, value: &str, value_type: ValueType) -> Sample {
    Sample::new(
        labels,
        Value::new(value_type, Float::from(value.to_owned()), None),
    )
}

/// The page's families, as `prom_text_format_parser::parse_scrape` assembles them; `None`
/// when a line is not of the plain shape or the lines do not assemble without an error.
pub(super) fn parse(text: &str) -> Option<Vec<Metric>> {
    let body = text.strip_suffix('\n').unwrap_or(text);
    if body.is_empty() {
        return None;
    }
    let mut metrics = Vec::new();
    let mut open: Option<Open<'_>> = None;
    for raw in body.split('\n') {
        let line = line(raw)?;
        let Some(mut family) = open.take() else {
            open = Some(Open::start(line));
            continue;
        };
        open = Some(match (family.state, line) {
            (State::Help, Line::Type { name, kind }) if name == family.name => {
                family.kind = Some(kind);
                family.state = State::Type;
                family
            }
            // A `HELP` after the `TYPE` (against the format, and forgiven).
            (State::Type, Line::Help { name, desc }) if name == family.name => {
                family.desc = Some(desc);
                family.state = State::Help;
                family
            }
            (
                _,
                Line::Sample {
                    name,
                    labels,
                    value,
                },
            ) => match member(family.name, name, family.kind) {
                Some(value_type) => {
                    family.samples.push(sample(labels, value, value_type));
                    family.state = State::Sample;
                    family
                }
                // Another family's samples right after a `HELP` or `TYPE`: an error.
                None if family.state != State::Sample => return None,
                None => {
                    metrics.push(family.finish());
                    Open::start(Line::Sample {
                        name,
                        labels,
                        value,
                    })
                }
            },
            (State::Sample, line) => {
                metrics.push(family.finish());
                Open::start(line)
            }
            // Two `HELP`s or two `TYPE`s, or a `HELP`/`TYPE` of another family before a sample.
            _ => return None,
        });
    }
    match open {
        Some(family) if family.state == State::Sample => metrics.push(family.finish()),
        // A family without samples: an error.
        Some(_) => return None,
        None => {}
    }
    Some(metrics)
}

/// Whether sample `name` belongs to the family `family` of type `kind`, and as what: the
/// crate's `names_are_equal` (`_bucket` of a histogram, `_sum`/`_count` of a histogram or
/// summary), without building the suffixed names.
fn member(family: &str, name: &str, kind: Option<Type>) -> Option<ValueType> {
    if name == family {
        return Some(ValueType::Sample);
    }
    let suffix = name.strip_prefix(family)?;
    let histogram = kind == Some(Type::Histogram);
    let summary = kind == Some(Type::Summary);
    match suffix {
        "_bucket" if histogram => Some(ValueType::Sample),
        "_sum" if histogram || summary => Some(ValueType::Sum),
        "_count" if histogram || summary => Some(ValueType::Count),
        _ => None,
    }
}

/// One line of the plain shape, or `None`.
fn line(l: &str) -> Option<Line<'_>> {
    if let Some(rest) = l.strip_prefix("# HELP ") {
        let (name, rest) = split_name(rest)?;
        // The crate's description: after the blanks, at least one character.
        let desc = rest.strip_prefix(' ')?.trim_start_matches([' ', '\t']);
        return (!desc.is_empty()).then_some(Line::Help { name, desc });
    }
    if let Some(rest) = l.strip_prefix("# TYPE ") {
        let (name, rest) = split_name(rest)?;
        let kind = match rest.strip_prefix(' ')? {
            "counter" => Type::Counter,
            "gauge" => Type::Gauge,
            "histogram" => Type::Histogram,
            "summary" => Type::Summary,
            "untyped" => Type::Untyped,
            _ => return None,
        };
        return Some(Line::Type { name, kind });
    }
    let (name, mut rest) = split_name(l)?;
    let mut labels = Vec::new();
    if let Some(mut inside) = rest.strip_prefix('{') {
        loop {
            let (key, after) = split_name(inside)?;
            let after = after.strip_prefix("=\"")?;
            let end = memchr::memchr2(b'"', b'\\', after.as_bytes())?;
            if after.as_bytes()[end] != b'"' {
                return None;
            }
            labels.push(Label::new(key.to_owned(), after[..end].to_owned()));
            let after = &after[end + 1..];
            if let Some(next) = after.strip_prefix(',') {
                inside = next;
            } else {
                rest = after.strip_prefix('}')?;
                break;
            }
        }
    }
    let value = rest.strip_prefix(' ')?;
    is_float(value).then_some(Line::Sample {
        name,
        labels: labels.into(),
        value,
    })
}

/// A metric or label name (`[a-zA-Z_:][a-zA-Z0-9_:]*`) at the start of `s`, and the rest.
fn split_name(s: &str) -> Option<(&str, &str)> {
    let bytes = s.as_bytes();
    let first = *bytes.first()?;
    if !(first.is_ascii_alphabetic() || first == b'_' || first == b':') {
        return None;
    }
    let end = bytes
        .iter()
        .position(|b| !(b.is_ascii_alphanumeric() || *b == b'_' || *b == b':'))
        .unwrap_or(bytes.len());
    Some(s.split_at(end))
}

/// The whole of `s` is a float of the crate's grammar: `[+-]?(d+(.d*)?|.d+)([eE][+-]?d+)?`,
/// or `NaN`, `Inf`, `+Inf`, `-Inf` in any case.
fn is_float(s: &str) -> bool {
    if ["nan", "inf", "+inf", "-inf"]
        .iter()
        .any(|w| s.eq_ignore_ascii_case(w))
    {
        return true;
    }
    let b = s.as_bytes();
    let mut i = usize::from(matches!(b.first(), Some(b'+' | b'-')));
    let digits = |i: &mut usize| {
        let start = *i;
        while b.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i - start
    };
    if digits(&mut i) > 0 {
        if b.get(i) == Some(&b'.') {
            i += 1;
            digits(&mut i);
        }
    } else if b.get(i) == Some(&b'.') {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    } else {
        return false;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}
