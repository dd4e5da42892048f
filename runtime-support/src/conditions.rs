//! Conditions as both operators set them: lastTransitionTime kept while a status holds.
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// `conditions` with `next` set: its lastTransitionTime is kept when the status did not change.
pub fn set_condition(conditions: &[Condition], mut next: Condition) -> Vec<Condition> {
    let mut out: Vec<Condition> = conditions.iter().filter(|c| c.type_ != next.type_).cloned().collect();
    if let Some(previous) = conditions.iter().find(|c| c.type_ == next.type_)
        && previous.status == next.status
    {
        next.last_transition_time = previous.last_transition_time.clone();
    }
    out.push(next);
    out
}

/// The most a condition's message may hold: the API refuses a longer one (in characters; cut in
/// bytes here, which is never more).
pub const MESSAGE_LIMIT: usize = 32768;

/// `message` cut to `MESSAGE_LIMIT`, ending with "…" where it was cut: a driver's error can be any
/// length, and a status write carrying a longer one would be refused, the condition never set.
fn within_limit(message: &str) -> String {
    if message.len() <= MESSAGE_LIMIT {
        return message.to_owned();
    }
    let mut end = MESSAGE_LIMIT - '…'.len_utf8();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

/// A condition set now.
pub fn condition(type_: &str, status: bool, reason: &str, message: &str, generation: Option<i64>) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: within_limit(message),
        observed_generation: generation,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_holds() {
        let mut first = condition("Failed", true, "failed", "one", Some(1));
        first.last_transition_time = Time(k8s_openapi::jiff::Timestamp::from_second(1000).unwrap());
        let again = set_condition(std::slice::from_ref(&first), condition("Failed", true, "failed", "two", Some(1)));
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].message, "two");
        assert_eq!(again[0].last_transition_time, first.last_transition_time);
        let flipped = set_condition(&again, condition("Failed", false, "ok", "", Some(1)));
        assert_ne!(flipped[0].last_transition_time, first.last_transition_time);
    }

    #[test]
    fn a_message_past_the_apis_limit_is_cut_where_a_character_ends() {
        let short = condition("Failed", true, "failed", "short", None);
        assert_eq!(short.message, "short");
        let long = "é".repeat(MESSAGE_LIMIT);
        let cut = condition("Failed", true, "failed", &long, None).message;
        assert!(cut.len() <= MESSAGE_LIMIT && cut.ends_with('…'), "{}", cut.len());
        assert!(cut.len() > MESSAGE_LIMIT - 8);
        let exact = "a".repeat(MESSAGE_LIMIT);
        assert_eq!(condition("Failed", true, "failed", &exact, None).message, exact);
    }
}
