//! Engines' TOML files read and edited with `toml_edit`, so the operator's formatting,
//! order and comments survive; plus the lookups and merges `configure` needs.

use toml_edit::{DocumentMut, Item, Table, TableLike};

/// Why a TOML file does not parse: the message and its 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    pub line: usize,
    pub message: String,
}

/// Parses `text`, keeping its formatting.
pub fn parse(text: &str) -> Result<DocumentMut, Malformed> {
    text.parse::<DocumentMut>().map_err(|e| {
        let at = e.span().map(|s| s.start).unwrap_or(0).min(text.len());
        Malformed {
            line: text[..at].matches('\n').count() + 1,
            message: e.message().trim().replace('\n', " "),
        }
    })
}

/// Parses `text` into plain values (for comparing what a file means, not how it looks).
pub fn values(text: &str) -> Result<toml::Table, String> {
    toml::from_str::<toml::Table>(text).map_err(|e| e.message().to_string())
}

/// The item at `keys` below `item` (through tables and inline tables).
pub fn get<'a>(item: &'a Item, keys: &[&str]) -> Option<&'a Item> {
    keys.iter()
        .try_fold(item, |it, k| it.as_table_like().and_then(|t| t.get(k)))
}

/// The table at `keys` below `table`, created (as implicit tables) where missing; inline
/// tables on the way become standard tables. `Err` names the first key that holds
/// something other than a table.
pub fn table_mut<'a>(table: &'a mut Table, keys: &[&str]) -> Result<&'a mut Table, String> {
    let mut cur = table;
    for (i, k) in keys.iter().enumerate() {
        let entry = cur.entry(k).or_insert_with(|| {
            let mut t = Table::new();
            t.set_implicit(true);
            Item::Table(t)
        });
        if let Item::Value(toml_edit::Value::InlineTable(_)) = entry {
            let taken = std::mem::take(entry);
            *entry = taken.into_table().map(Item::Table).unwrap_or_else(|i| i);
        }
        cur = entry.as_table_mut().ok_or_else(|| keys[..=i].join("."))?;
    }
    Ok(cur)
}

/// Merges `from` into `acc` key by key; tables merge recursively, anything else is
/// replaced (containerd 2.x's merge of imported files).
pub fn merge(acc: &mut Table, from: &dyn TableLike) {
    for (k, v) in from.iter() {
        match (acc.get_mut(k), v.as_table_like()) {
            (Some(existing), Some(sub)) if existing.is_table_like() => {
                if let Some(Item::Value(toml_edit::Value::InlineTable(_))) = Some(&*existing) {
                    let taken = std::mem::take(existing);
                    *existing = taken.into_table().map(Item::Table).unwrap_or_else(|i| i);
                }
                if let Some(t) = existing.as_table_mut() {
                    merge(t, sub);
                }
            }
            _ => {
                let mut item = v.clone();
                if let Item::Value(toml_edit::Value::InlineTable(_)) = item {
                    item = item.into_table().map(Item::Table).unwrap_or_else(|i| i);
                }
                acc.insert(k, item);
            }
        }
    }
}

/// The strings of an array item; `None` when `item` is not an array of strings.
pub fn strings(item: &Item) -> Option<Vec<String>> {
    item.as_array()?
        .iter()
        .map(|v| v.as_str().map(str::to_string))
        .collect()
}

/// What `item` says as plain values (no formatting, no key order).
pub fn item_value(item: &Item) -> Result<toml::Value, String> {
    let mut d = DocumentMut::new();
    d.insert(
        "x",
        item.clone()
            .into_table()
            .map(Item::Table)
            .unwrap_or_else(|i| i),
    );
    Ok(values(&d.to_string())?
        .remove("x")
        .unwrap_or(toml::Value::Table(toml::Table::new())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_names_the_line() {
        let e = parse("a = 1\nb = [\nc = \n").unwrap_err();
        assert!(e.line >= 2, "{e:?}");
        assert!(!e.message.contains('\n'));
    }

    #[test]
    fn table_mut_creates_and_converts() {
        let mut doc = parse("[a]\nb = { c = 1 }\n").unwrap();
        table_mut(doc.as_table_mut(), &["a", "b", "d"])
            .unwrap()
            .insert("e", toml_edit::value(2));
        let v = values(&doc.to_string()).unwrap();
        assert_eq!(v["a"]["b"]["c"].as_integer(), Some(1));
        assert_eq!(v["a"]["b"]["d"]["e"].as_integer(), Some(2));
        let mut doc = parse("a = 3\n").unwrap();
        assert_eq!(table_mut(doc.as_table_mut(), &["a", "b"]).unwrap_err(), "a");
    }

    #[test]
    fn merge_is_deep_and_later_wins() {
        let mut acc = parse("[r]\nx = 1\n[r.o]\np = 1\nq = 1\n").unwrap();
        let from = parse("[r]\nx = 2\no = { q = 2 }\n").unwrap();
        let from_r = from.get("r").and_then(Item::as_table_like).unwrap();
        merge(
            acc.as_table_mut()
                .get_mut("r")
                .unwrap()
                .as_table_mut()
                .unwrap(),
            from_r,
        );
        let v = values(&acc.to_string()).unwrap();
        assert_eq!(v["r"]["x"].as_integer(), Some(2));
        assert_eq!(v["r"]["o"]["p"].as_integer(), Some(1));
        assert_eq!(v["r"]["o"]["q"].as_integer(), Some(2));
    }
}
