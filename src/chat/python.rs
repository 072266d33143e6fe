//! Python-compatible behaviour for chat templates: `json.dumps` (transformers' `tojson`),
//! `str()`/`repr()` printing, `str.rsplit` and `datetime.strftime`.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Python's `str.rsplit(sep=None, maxsplit=-1)`.
pub(super) fn py_rsplit(s: &str, sep: Option<&str>, maxsplit: i64) -> Result<Vec<String>, Error> {
    let limit = usize::try_from(maxsplit).ok();
    let mut parts: Vec<String> = Vec::new();
    match sep {
        Some("") => return Err(Error::new(ErrorKind::InvalidOperation, "empty separator")),
        Some(sep) => match limit {
            None => parts.extend(s.split(sep).map(str::to_string)),
            Some(n) => {
                parts.extend(s.rsplitn(n + 1, sep).map(str::to_string));
                parts.reverse();
            }
        },
        None => {
            let mut rest = s.trim_end();
            while !rest.is_empty() && limit.is_none_or(|n| parts.len() < n) {
                match rest.rfind(char::is_whitespace) {
                    Some(i) => {
                        let ws_len = rest[i..].chars().next().map_or(1, char::len_utf8);
                        parts.push(rest[i + ws_len..].to_string());
                        rest = rest[..i].trim_end();
                    }
                    None => break,
                }
            }
            if !rest.is_empty() {
                parts.push(rest.to_string());
            }
            parts.reverse();
        }
    }
    Ok(parts)
}

/// Options of Python's `json.dumps` as exposed by transformers' `tojson` filter.
struct JsonOptions {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
pub(super) fn tojson_filter(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_str(), v.as_i64()) {
            (Some(s), _) => Some(s.to_string()),
            (None, Some(n)) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an int or a string",
                ))
            }
        },
    };
    // Python's defaults: ", " between items on one line, "," when indenting (the newline
    // separates items there).
    let (mut item_sep, mut key_sep) = (
        if indent.is_some() { "," } else { ", " }.to_string(),
        ": ".to_string(),
    );
    if let Some(seps) = kwargs.get::<Option<Vec<String>>>("separators")? {
        match seps.as_slice() {
            [a, b] => (item_sep, key_sep) = (a.clone(), b.clone()),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair",
                ))
            }
        }
    }
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let opts = JsonOptions {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    write_json(&mut out, value, &opts, 0)?;
    Ok(out)
}

fn not_serializable(v: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("Object of type {} is not JSON serializable", v.kind()),
    )
}

fn write_json(out: &mut String, v: &Value, o: &JsonOptions, level: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&py_number(v, true)),
        ValueKind::String => write_json_str(out, v.as_str().unwrap_or_default(), o.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, o, level, '[', ']', items.len(), |out, i| {
                write_json(out, &items[i], o, level + 1)
            })?;
        }
        ValueKind::Map | ValueKind::Plain => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in v.try_iter()? {
                let item = v.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if o.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, o, level, '{', '}', entries.len(), |out, i| {
                write_json_str(out, &entries[i].0, o.ensure_ascii);
                out.push_str(&o.key_sep);
                write_json(out, &entries[i].1, o, level + 1)
            })?;
        }
        _ => return Err(not_serializable(v)),
    }
    Ok(())
}

/// Writes `open item sep item ... close`, with Python's newline-and-indent layout when set.
fn write_container(
    out: &mut String,
    o: &JsonOptions,
    level: usize,
    open: char,
    close: char,
    len: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    let newline = |lvl: usize| {
        o.indent
            .as_ref()
            .map(|ind| format!("\n{}", ind.repeat(lvl)))
    };
    let inner = newline(level + 1).unwrap_or_default();
    out.push_str(&inner);
    for i in 0..len {
        if i > 0 {
            out.push_str(&o.item_sep);
            out.push_str(&inner);
        }
        item(out, i)?;
    }
    out.push_str(&newline(level).unwrap_or_default());
    out.push(close);
    Ok(())
}

/// Python's json key coercion: str as is, numbers/bools/None to their JSON text.
fn json_key(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::Number => Ok(py_number(key, true)),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_string()),
        ValueKind::None => Ok("null".to_string()),
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            "keys must be str, int, float, bool or None",
        )),
    }
}

fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A number as Python prints it (`repr`); `json` selects json.dumps' NaN/Infinity spelling.
fn py_number(v: &Value, json: bool) -> String {
    if v.is_integer() {
        return v.to_string();
    }
    match f64::try_from(v.clone()) {
        Ok(f) => py_float(f, json),
        Err(_) => v.to_string(),
    }
}

/// Python's `repr(float)`: shortest round-trip digits, exponent form outside [1e-4, 1e16).
fn py_float(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.to_string();
    }
    if f.is_infinite() {
        let s = if json { "Infinity" } else { "inf" };
        return if f < 0.0 {
            format!("-{s}")
        } else {
            s.to_string()
        };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let s = format!("{f}");
        if s.contains('.') {
            s
        } else {
            s + ".0"
        }
    } else {
        format!(
            "{mantissa}e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    }
}

/// Python's `str(x)`: strings as is, everything else as `repr`.
pub(super) fn py_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        ValueKind::Undefined => String::new(),
        _ => py_repr(v),
    }
}

/// Python's `repr(x)` for the value kinds a template can produce.
fn py_repr(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".to_string(),
        ValueKind::Bool => if v.is_true() { "True" } else { "False" }.to_string(),
        ValueKind::Number => py_number(v, false),
        ValueKind::String => py_str_repr(v.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            let items: Vec<String> = v
                .try_iter()
                .map(|it| it.map(|x| py_repr(&x)).collect())
                .unwrap_or_default();
            if v.is_tuple() {
                let trailing = if items.len() == 1 { "," } else { "" };
                format!("({}{trailing})", items.join(", "))
            } else {
                format!("[{}]", items.join(", "))
            }
        }
        ValueKind::Map if v.as_object().is_none_or(|_| v.try_iter().is_ok()) => {
            let items: Vec<String> = v
                .try_iter()
                .map(|it| {
                    it.map(|k| {
                        let val = v.get_item(&k).unwrap_or_default();
                        format!("{}: {}", py_repr(&k), py_repr(&val))
                    })
                    .collect()
                })
                .unwrap_or_default();
            format!("{{{}}}", items.join(", "))
        }
        _ => v.to_string(),
    }
}

fn py_str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => {
                let _ = match c as u32 {
                    n @ 0..=0xff => write!(out, "\\x{n:02x}"),
                    n => write!(out, "\\u{n:04x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

pub(super) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0))
}

/// `datetime.now().strftime(fmt)` for the C locale, in UTC (no time-zone data is available;
/// templates only use it for a "today's date" line). glibc's `%-d`-style flags are supported.
pub(super) fn strftime_utc(fmt: &str, unix: i64) -> String {
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let weekday = usize::try_from((days + 3).rem_euclid(7)).unwrap_or(0); // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[usize::try_from(month - 1).unwrap_or(0).min(11)];
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.next_if_eq(&'-').is_some();
        let num = |n: i64, width: usize| {
            if unpadded {
                n.to_string()
            } else {
                format!("{n:0width$}")
            }
        };
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let piece = match d {
            'Y' => year.to_string(),
            'y' => num(year.rem_euclid(100), 2),
            'm' => num(month, 2),
            'd' => num(day, 2),
            'e' => format!("{day:2}"),
            'H' => num(hour, 2),
            'I' => num(hour12, 2),
            'M' => num(minute, 2),
            'S' => num(second, 2),
            'j' => num(yday, 3),
            'p' => if hour < 12 { "AM" } else { "PM" }.to_string(),
            'A' => DAYS[weekday].to_string(),
            'a' => DAYS[weekday][..3].to_string(),
            'B' => month_name.to_string(),
            'b' | 'h' => month_name[..3].to_string(),
            'F' => format!("{year}-{month:02}-{day:02}"),
            'D' | 'x' => format!("{month:02}/{day:02}/{:02}", year.rem_euclid(100)),
            'T' | 'X' => format!("{hour:02}:{minute:02}:{second:02}"),
            'R' => format!("{hour:02}:{minute:02}"),
            'c' => format!(
                "{} {} {day:2} {hour:02}:{minute:02}:{second:02} {year}",
                &DAYS[weekday][..3],
                &month_name[..3]
            ),
            'Z' => "UTC".to_string(),
            'z' => "+0000".to_string(),
            '%' => "%".to_string(),
            other => format!("%{}{other}", if unpadded { "-" } else { "" }),
        };
        out.push_str(&piece);
    }
    out
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// (year, month, day) to days since 1970-01-01, proleptic Gregorian.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_repr() {
        assert_eq!(py_float(1.0, false), "1.0");
        assert_eq!(py_float(0.1, false), "0.1");
        assert_eq!(py_float(1e16, false), "1e+16");
        assert_eq!(py_float(1.5e-5, false), "1.5e-05");
        assert_eq!(py_float(123456.75, false), "123456.75");
        assert_eq!(py_float(f64::NAN, true), "NaN");
        assert_eq!(py_float(f64::NEG_INFINITY, false), "-inf");
    }

    #[test]
    fn python_rsplit() {
        assert_eq!(py_rsplit("a b  c ", None, 1).unwrap(), vec!["a b", "c"]);
        assert_eq!(py_rsplit("a,b,c", Some(","), 1).unwrap(), vec!["a,b", "c"]);
        assert_eq!(
            py_rsplit("a,b,c", Some(","), -1).unwrap(),
            vec!["a", "b", "c"]
        );
        assert_eq!(py_rsplit("", None, -1).unwrap(), Vec::<String>::new());
        assert!(py_rsplit("abc", Some(""), -1).is_err());
    }

    #[test]
    fn strftime_known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(
            strftime_utc("%Y-%m-%d %H:%M:%S %a %A %b %B %j %p %I", t),
            "2024-02-29 13:05:09 Thu Thursday Feb February 060 PM 01"
        );
        assert_eq!(strftime_utc("%-d %b %Y|%e|%%|%Q", t), "29 Feb 2024|29|%|%Q");
        assert_eq!(strftime_utc("%Y-%m-%d", 0), "1970-01-01");
        assert_eq!(strftime_utc("%F %T", -1), "1969-12-31 23:59:59");
    }
}
