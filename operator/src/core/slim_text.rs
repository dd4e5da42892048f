//! The small parts of a slim cache's metadata (`core::slim`). A UID is a 36-character UUID and a
//! resourceVersion a decimal number: held as 16 bytes and 8 bytes, each is given back as the very
//! text it was (anything not in that exact form is kept as text). An owner's apiVersion and kind,
//! the same few words across every object, are shared.
use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::primitives::locked;

/// A UID or resourceVersion, compact where its text allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlimText {
    /// A lowercase, hyphenated UUID.
    Uuid([u8; 16]),
    /// A decimal number without leading zeros.
    Number(u64),
    Text(Box<str>),
}

const HYPHENS: [usize; 4] = [8, 13, 18, 23];

fn uuid(text: &str) -> Option<[u8; 16]> {
    let bytes = text.as_bytes();
    if bytes.len() != 36 || HYPHENS.iter().any(|&at| bytes[at] != b'-') {
        return None;
    }
    let digits = bytes.iter().enumerate().filter(|(at, _)| !HYPHENS.contains(at)).map(|(_, digit)| *digit);
    let mut value = [0u8; 16];
    for (at, digit) in digits.enumerate() {
        let nibble = match digit {
            b'0'..=b'9' => digit - b'0',
            b'a'..=b'f' => digit - b'a' + 10,
            _ => return None,
        };
        let byte = value.get_mut(at / 2)?;
        *byte = (*byte << 4) | nibble;
    }
    Some(value)
}

impl SlimText {
    pub fn of(text: String) -> Self {
        if let Some(value) = uuid(&text) {
            return SlimText::Uuid(value);
        }
        let plain_number = !text.is_empty() && (text == "0" || !text.starts_with('0'));
        match text.parse::<u64>() {
            Ok(number) if plain_number && text.bytes().all(|b| b.is_ascii_digit()) => SlimText::Number(number),
            _ => SlimText::Text(text.into_boxed_str()),
        }
    }

    /// The text as it came.
    pub fn text(&self) -> String {
        match self {
            SlimText::Uuid(value) => {
                let mut text = String::with_capacity(36);
                for (at, byte) in value.iter().enumerate() {
                    if [4, 6, 8, 10].contains(&at) {
                        text.push('-');
                    }
                    text.push_str(&format!("{byte:02x}"));
                }
                text
            }
            SlimText::Number(number) => number.to_string(),
            SlimText::Text(text) => text.to_string(),
        }
    }

    #[cfg(test)]
    pub fn is(&self, text: &str) -> bool {
        *self == SlimText::of(text.to_owned())
    }
}

/// One shared copy of each apiVersion and kind seen.
fn shared_word(word: String) -> Arc<str> {
    static WORDS: OnceLock<Mutex<HashSet<Arc<str>>>> = OnceLock::new();
    let mut words = locked(WORDS.get_or_init(Mutex::default));
    if let Some(shared) = words.get(word.as_str()) {
        return Arc::clone(shared);
    }
    let shared: Arc<str> = word.into();
    words.insert(Arc::clone(&shared));
    shared
}

/// An owner reference, compact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlimOwner {
    pub api_version: Arc<str>,
    pub kind: Arc<str>,
    pub name: Box<str>,
    pub uid: SlimText,
    pub controller: Option<bool>,
    pub block_owner_deletion: Option<bool>,
}

impl SlimOwner {
    pub fn of(owner: OwnerReference) -> Self {
        SlimOwner {
            api_version: shared_word(owner.api_version),
            kind: shared_word(owner.kind),
            name: owner.name.into_boxed_str(),
            uid: SlimText::of(owner.uid),
            controller: owner.controller,
            block_owner_deletion: owner.block_owner_deletion,
        }
    }

    pub fn reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: self.api_version.to_string(),
            kind: self.kind.to_string(),
            name: self.name.to_string(),
            uid: self.uid.text(),
            controller: self.controller,
            block_owner_deletion: self.block_owner_deletion,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_text_comes_back_as_it_was() {
        for text in [
            "0f8b4c2e-1d3a-4b5c-9e7f-a1b2c3d4e5f6",
            "0F8B4C2E-1D3A-4B5C-9E7F-A1B2C3D4E5F6",
            "0f8b4c2e1d3a4b5c9e7fa1b2c3d4e5f6xxxx",
            "0f8b4c2e-1d3a-4b5c-9e7f-a1b2c3d4e5g6",
            "123456",
            "0",
            "007",
            "+7",
            "18446744073709551616",
            "",
            "uid-1",
        ] {
            let slim = SlimText::of(text.to_owned());
            assert_eq!(slim.text(), text);
            assert!(slim.is(text));
        }
        assert!(matches!(SlimText::of("0f8b4c2e-1d3a-4b5c-9e7f-a1b2c3d4e5f6".into()), SlimText::Uuid(_)));
        assert!(matches!(SlimText::of("123456".into()), SlimText::Number(123_456)));
        assert!(matches!(SlimText::of("007".into()), SlimText::Text(_)));
        assert!(!SlimText::of("123".into()).is("0123"));
    }

    #[test]
    fn owners_share_their_words_and_come_back_whole() {
        let owner = |name: &str| OwnerReference {
            api_version: "v1".into(),
            kind: "PersistentVolumeClaim".into(),
            name: name.into(),
            uid: "0f8b4c2e-1d3a-4b5c-9e7f-a1b2c3d4e5f6".into(),
            controller: Some(true),
            block_owner_deletion: None,
        };
        let (a, b) = (SlimOwner::of(owner("a")), SlimOwner::of(owner("b")));
        assert!(Arc::ptr_eq(&a.kind, &b.kind) && Arc::ptr_eq(&a.api_version, &b.api_version));
        assert_eq!(a.reference(), owner("a"));
    }
}
