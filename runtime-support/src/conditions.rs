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

/// A condition set now.
pub fn condition(type_: &str, status: bool, reason: &str, message: &str, generation: Option<i64>) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
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
}
