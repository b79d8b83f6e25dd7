//! Integer helpers for the overlap solver.
//!
//! Positions are `i128` inside the solver: every offset of a valid view is
//! below 2^64 and every stride below 2^36, so sums, differences and the
//! products the solver forms stay far inside `i128`.

/// ⌊a / b⌋ for `b > 0`.
pub(super) fn div_floor(a: i128, b: i128) -> i128 {
    // 128-bit division is a library call; nearly every operand fits 64 bits.
    match (i64::try_from(a), i64::try_from(b)) {
        (Ok(a), Ok(b)) => i128::from(a.div_euclid(b)),
        _ => a.div_euclid(b),
    }
}

/// ⌈a / b⌉ for `b > 0`.
pub(super) fn div_ceil(a: i128, b: i128) -> i128 {
    -div_floor(-a, b)
}

/// `a mod b` in `[0, b)` for `b > 0`.
pub(super) fn rem(a: i128, b: i128) -> i128 {
    match (i64::try_from(a), i64::try_from(b)) {
        (Ok(a), Ok(b)) => i128::from(a.rem_euclid(b)),
        _ => a.rem_euclid(b),
    }
}

pub(super) fn gcd(mut a: i128, mut b: i128) -> i128 {
    while b != 0 {
        (a, b) = (b, rem(a, b));
    }
    a.abs()
}

/// Least common multiple of two positive numbers, `None` past 2^100 (the
/// solver only lifts to small multiples anyway).
pub(super) fn lcm(a: i128, b: i128) -> Option<i128> {
    let l = (a / gcd(a, b)).checked_mul(b)?;
    (l < 1 << 100).then_some(l)
}

/// `Σ_{i=0}^{n-1} ⌊(a·i + b) / m⌋` modulo 2^128, for `n, a, b ≥ 0` and
/// `m > 0` (the classic Euclid-like reduction, O(log m) steps).
///
/// Only differences of two such sums are used, and those are small, so the
/// wrap-around of large intermediate sums cancels out.
pub(super) fn floor_sum(n: u128, m: u128, a: u128, b: u128) -> u128 {
    let (mut n, mut m, mut a, mut b) = (n, m, a, b);
    let mut ans: u128 = 0;
    loop {
        if a >= m {
            let tri = if n % 2 == 0 {
                (n / 2).wrapping_mul(n.wrapping_sub(1))
            } else {
                n.wrapping_mul((n - 1) / 2)
            };
            let (q, r) = divrem(a, m);
            ans = ans.wrapping_add(tri.wrapping_mul(q));
            a = r;
        }
        if b >= m {
            let (q, r) = divrem(b, m);
            ans = ans.wrapping_add(n.wrapping_mul(q));
            b = r;
        }
        // a < m and b < m here, and n·a stays below 2^127 for the solver's
        // inputs (n·a ≤ span of a view), so y_max is exact.
        let y_max = a * n + b;
        if y_max < m {
            return ans;
        }
        (n, b) = divrem(y_max, m);
        (m, a) = (a, m);
    }
}

/// Quotient and remainder, through 64-bit division when both operands fit.
fn divrem(a: u128, b: u128) -> (u128, u128) {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => (u128::from(a / b), u128::from(a % b)),
        _ => (a / b, a % b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_sum_matches_brute_force() {
        for n in 0..20u128 {
            for m in 1..12u128 {
                for a in 0..15u128 {
                    for b in 0..15u128 {
                        let brute: u128 = (0..n).map(|i| (a * i + b) / m).sum();
                        assert_eq!(floor_sum(n, m, a, b), brute, "n={n} m={m} a={a} b={b}");
                    }
                }
            }
        }
    }

    #[test]
    fn divisions_round_the_right_way() {
        assert_eq!(div_floor(-7, 2), -4);
        assert_eq!(div_ceil(-7, 2), -3);
        assert_eq!(div_floor(7, 2), 3);
        assert_eq!(div_ceil(7, 2), 4);
        assert_eq!(div_ceil(8, 2), 4);
        assert_eq!(lcm(4, 6), Some(12));
        assert_eq!(gcd(0, 5), 5);
    }
}
