//! Sleep with tags on the vmm backend, on the strict simulated driver: blocks allocated under a
//! tag the caller discards lose their contents, the others keep theirs bit for bit; tags nest,
//! belong to the thread that pushed them, and a bad or unknown tag changes nothing.

mod common;
#[path = "common/contents.rs"]
mod contents;
use common::*;
use contents::*;

#[test]
fn a_level_1_sleep_keeps_contents_bitwise_and_discards_those_of_discarded_tags() {
    let r = vmm_rig(256 * MIB);
    // Whole pages apart, so that no page is shared between a kept and a discarded block.
    let keep = tagged(&r, None, 4 * MIB);
    let kv = tagged(&r, Some("kv_cache"), 4 * MIB);
    let other = tagged(&r, Some("weights"), 2 * MIB);
    let small_kv = tagged(&r, Some("kv_cache"), 64 * 1024);
    for (seed, (ptr, bytes)) in [(keep, 4 * MIB), (kv, 4 * MIB), (other, 2 * MIB)]
        .into_iter()
        .enumerate()
    {
        fill(&r, ptr, bytes, seed as u8);
    }
    fill(&r, small_kv, 64 * 1024, 9);
    // A plain level-1 sleep keeps everything.
    r.device(0).sleep(1, &[]).unwrap();
    let everything = r.device(0).sleep_saved_bytes();
    r.device(0).wake().unwrap();
    assert_eq!(r.device(0).sleep_saved_bytes(), 0);
    assert!(holds(&r, keep, 4 * MIB, 0) && holds(&r, kv, 4 * MIB, 1));
    assert!(holds(&r, other, 2 * MIB, 2) && holds(&r, small_kv, 64 * 1024, 9));
    // Discarding kv_cache: its blocks come back as fresh memory, the others bit for bit.
    let given_back = r.device(0).sleep(1, &["kv_cache"]).unwrap();
    assert_eq!(r.sim.physical_bytes(0), 0, "every page went back");
    assert_eq!(r.device(0).sleeping_bytes(), given_back);
    let saved = r.device(0).sleep_saved_bytes();
    assert_eq!(
        saved,
        everything - 4 * MIB - 2 * MIB,
        "kv_cache's 2 pages and its carrier"
    );
    r.device(0).wake().unwrap();
    assert!(holds(&r, keep, 4 * MIB, 0), "an untagged block is kept");
    assert!(
        holds(&r, other, 2 * MIB, 2),
        "a block of another tag is kept"
    );
    assert!(discarded(&r, kv, 4 * MIB) && discarded(&r, small_kv, 64 * 1024));
    for (ptr, bytes) in [(keep, 4 * MIB), (kv, 4 * MIB), (other, 2 * MIB)] {
        r.sim.touch(0, 0, ptr, bytes, s(1)).unwrap();
        r.free(ptr, 0);
    }
    r.free(small_kv, 0);
    r.finish();
}

#[test]
fn tags_nest_and_the_innermost_wins() {
    let r = vmm_rig(256 * MIB);
    streampool::tag::push("outer").unwrap();
    let a = r.malloc(2 * MIB, 0, 1);
    streampool::tag::push("inner").unwrap();
    let b = r.malloc(2 * MIB, 0, 1);
    streampool::tag::pop().unwrap();
    let c = r.malloc(2 * MIB, 0, 1); // outer again
    streampool::tag::pop().unwrap();
    let d = r.malloc(2 * MIB, 0, 1); // no tag
    assert_eq!(streampool::tag::current_name(), None);
    let blocks = [a, b, c, d];
    let write_all = || {
        for (seed, &ptr) in blocks.iter().enumerate() {
            fill(&r, ptr, 2 * MIB, seed as u8);
        }
    };
    write_all();
    r.device(0).sleep(1, &["inner"]).unwrap();
    r.device(0).wake().unwrap();
    assert!(holds(&r, a, 2 * MIB, 0) && holds(&r, c, 2 * MIB, 2) && holds(&r, d, 2 * MIB, 3));
    assert!(
        discarded(&r, b, 2 * MIB),
        "the inner tag, not the outer, marks b"
    );
    write_all();
    r.device(0).sleep(1, &["outer"]).unwrap();
    r.device(0).wake().unwrap();
    assert!(discarded(&r, a, 2 * MIB) && discarded(&r, c, 2 * MIB));
    assert!(holds(&r, b, 2 * MIB, 1) && holds(&r, d, 2 * MIB, 3));
    write_all();
    r.device(0).sleep(1, &["inner", "outer"]).unwrap();
    r.device(0).wake().unwrap();
    assert!(blocks[..3].iter().all(|&p| discarded(&r, p, 2 * MIB)));
    assert!(holds(&r, d, 2 * MIB, 3));
    for p in blocks {
        r.free(p, 0);
    }
    r.finish();
}

#[test]
fn a_tag_marks_only_the_blocks_of_the_thread_that_pushed_it() {
    let r = vmm_rig(256 * MIB);
    streampool::tag::push("kv_cache").unwrap();
    let mine = r.malloc(2 * MIB, 0, 1);
    let (theirs, their_tagged) = std::thread::scope(|scope| {
        let other = scope.spawn(|| {
            let theirs = r.malloc(2 * MIB, 0, 2); // no tag on this thread
            streampool::tag::push("thread_tag").unwrap();
            let tagged = r.malloc(2 * MIB, 0, 2);
            streampool::tag::pop().unwrap();
            (theirs, tagged)
        });
        other.join().unwrap()
    });
    let after = r.malloc(2 * MIB, 0, 1); // the other thread's push and pop left mine alone
    streampool::tag::pop().unwrap();
    for (seed, ptr) in [mine, theirs, their_tagged, after].into_iter().enumerate() {
        fill(&r, ptr, 2 * MIB, seed as u8);
    }
    r.device(0).sleep(1, &["kv_cache"]).unwrap();
    r.device(0).wake().unwrap();
    assert!(discarded(&r, mine, 2 * MIB) && discarded(&r, after, 2 * MIB));
    assert!(holds(&r, theirs, 2 * MIB, 1) && holds(&r, their_tagged, 2 * MIB, 2));
    for ptr in [mine, theirs, their_tagged, after] {
        r.free(ptr, 0);
    }
    r.finish();
}

#[test]
fn discarding_an_unknown_or_bad_tag_is_refused_and_changes_nothing() {
    let r = vmm_rig(256 * MIB);
    let kv = tagged(&r, Some("kv_cache"), 2 * MIB);
    let held = r.sim.physical_bytes(0);
    let long = "k".repeat(streampool::tag::MAX_TAG_BYTES + 1);
    for (discard, what) in [
        (
            vec!["kv_cache", "never_pushed_tag"],
            "unknown tag \"never_pushed_tag\"",
        ),
        (vec![""], "empty"),
        (vec![long.as_str()], "bytes long"),
    ] {
        let e = r.device(0).sleep(1, &discard).unwrap_err();
        assert!(matches!(e, streampool::Error::InvalidArgument(_)), "{e}");
        assert!(e.to_string().contains(what), "{e}");
        assert_eq!(r.sim.physical_bytes(0), held);
        assert_eq!(r.device(0).sleeping_bytes(), 0);
        assert_eq!(r.sim.calls("cuMemcpyDtoHAsync"), 0);
    }
    for bad in ["", long.as_str()] {
        assert!(streampool::tag::push(bad).is_err());
    }
    let untagged = r.malloc(2 * MIB, 0, 1);
    assert!(
        r.device(0).sleep(1, &["kv_cache"]).is_ok(),
        "refused pushes left no tag"
    );
    assert_eq!(
        r.device(0).sleep_saved_bytes(),
        2 * MIB,
        "the untagged block alone"
    );
    r.device(0).wake().unwrap();
    r.free(kv, 0);
    r.free(untagged, 0);
    r.finish();
    // The pool backend refuses as a plain sleep does.
    let r = pool_rig(64 * MIB);
    let e = r.device(0).sleep(1, &["kv_cache"]).unwrap_err();
    assert!(e.to_string().contains("STREAMPOOL_BACKEND=vmm"), "{e}");
    r.finish();
}

#[test]
fn a_tagged_block_freed_while_asleep_leaves_no_tag_behind() {
    let r = vmm_rig(256 * MIB);
    let keep = tagged(&r, None, 2 * MIB);
    let kv = tagged(&r, Some("kv_cache"), 2 * MIB);
    fill(&r, keep, 2 * MIB, 1);
    r.device(0).sleep(1, &["kv_cache"]).unwrap();
    r.free(kv, 0); // frees are booked while asleep
    r.device(0).wake().unwrap();
    assert!(holds(&r, keep, 2 * MIB, 1));
    // The next block of that size on that stream takes kv's place, without its tag.
    let again = tagged(&r, None, 2 * MIB);
    assert_eq!(again, kv, "the freed block's address is handed out again");
    fill(&r, again, 2 * MIB, 2);
    r.device(0).sleep(1, &["kv_cache"]).unwrap();
    r.device(0).wake().unwrap();
    assert!(
        holds(&r, again, 2 * MIB, 2),
        "an untagged block at a freed tagged block's place"
    );
    r.free(again, 0);
    r.free(keep, 0);
    r.finish();
}
