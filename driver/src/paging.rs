//! Token pagination shared by the List RPCs: the token is the index of the next entry.
use tonic::Status;

/// The page of `items` that `starting_token` and `max_entries` ask for, and the token of the next
/// page (empty after the last). A token that does not fit is ABORTED, as CSI specifies.
pub fn page<T: Clone>(items: &[T], starting_token: &str, max_entries: i32) -> Result<(Vec<T>, String), Status> {
    let start = if starting_token.is_empty() {
        0
    } else {
        starting_token
            .parse::<usize>()
            .map_err(|_| Status::aborted(format!("invalid starting_token {starting_token:?}")))?
    };
    if start > items.len() {
        return Err(Status::aborted(format!("starting_token {start} is past the end")));
    }
    let max = usize::try_from(max_entries).map_err(|_| Status::invalid_argument("max_entries must not be negative"))?;
    let end = if max == 0 { items.len() } else { items.len().min(start + max) };
    let next = if end < items.len() { end.to_string() } else { String::new() };
    Ok((items[start..end].to_vec(), next))
}

#[cfg(test)]
mod tests {
    use super::page;

    #[test]
    fn pages_walk_the_list_and_bad_tokens_abort() {
        let items = [1, 2, 3, 4, 5];
        assert_eq!(page(&items, "", 0).unwrap(), (items.to_vec(), String::new()));
        assert_eq!(page(&items, "", 2).unwrap(), (vec![1, 2], "2".into()));
        assert_eq!(page(&items, "2", 2).unwrap(), (vec![3, 4], "4".into()));
        assert_eq!(page(&items, "4", 2).unwrap(), (vec![5], String::new()));
        assert_eq!(page(&items, "invalid-token", 0).unwrap_err().code(), tonic::Code::Aborted);
        assert_eq!(page(&items, "6", 0).unwrap_err().code(), tonic::Code::Aborted);
        assert_eq!(page(&items, "", -1).unwrap_err().code(), tonic::Code::InvalidArgument);
    }
}
