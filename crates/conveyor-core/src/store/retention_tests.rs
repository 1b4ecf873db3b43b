use super::*;

#[test]
fn uuid_v7_floor_orders_below_every_id_of_its_millisecond_and_after() {
    let at = DateTime::<Utc>::from_timestamp_millis(1_780_000_000_123).expect("time");
    let floor = uuid_v7_floor(at);
    assert_eq!(floor.get_version_num(), 7);
    let same_ms = Uuid::new_v7(uuid::Timestamp::from_unix(
        uuid::NoContext,
        1_780_000_000,
        123_000_000,
    ));
    let earlier = Uuid::new_v7(uuid::Timestamp::from_unix(
        uuid::NoContext,
        1_780_000_000,
        122_000_000,
    ));
    assert!(floor <= same_ms);
    assert!(earlier < floor);
    // Text order (the SQLite store keeps ids as text) agrees with byte order.
    assert!(earlier.to_string() < floor.to_string());
    assert!(floor.to_string() <= same_ms.to_string());
}
