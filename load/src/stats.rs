//! The statistics of `--repeat`: min / median / max of a metric's runs.

/// Min, median and max of some values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Summary {
    pub(crate) min: f64,
    /// The middle value, or the mean of the two middle values of an even count.
    pub(crate) median: f64,
    pub(crate) max: f64,
}

/// The summary of the finite values among `values`; `None` if there is none (a metric that
/// could not be measured is NaN, and is left out rather than poisoning the summary).
pub(crate) fn summarize(values: &[f64]) -> Option<Summary> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    let median = if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    };
    Some(Summary {
        min: sorted[0],
        median,
        max: sorted[sorted.len() - 1],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_count_takes_the_middle() {
        let summary = summarize(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!(
            summary,
            Summary {
                min: 1.0,
                median: 3.0,
                max: 5.0
            }
        );
    }

    #[test]
    fn even_count_averages_the_two_middles() {
        let summary = summarize(&[4.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!(summary.min, 1.0);
        assert_eq!(summary.median, 3.0);
        assert_eq!(summary.max, 10.0);
    }

    #[test]
    fn single_value_is_all_three() {
        let summary = summarize(&[7.5]).unwrap();
        assert_eq!((summary.min, summary.median, summary.max), (7.5, 7.5, 7.5));
    }

    #[test]
    fn non_finite_values_are_left_out() {
        assert_eq!(summarize(&[]), None);
        assert_eq!(summarize(&[f64::NAN, f64::INFINITY]), None);
        let summary = summarize(&[f64::NAN, 2.0, 4.0]).unwrap();
        assert_eq!((summary.min, summary.median, summary.max), (2.0, 3.0, 4.0));
    }
}
