//! The lab's lock user (the `acl-reset` fault) has exactly the README's
//! minimal ACL: if one changes, so must the other.

use leasehold_chaos::{ACL_RULES, ACL_USER};

#[test]
fn the_labs_acl_user_is_the_readmes() -> Result<(), Box<dyn std::error::Error>> {
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
    )?;
    let prefix = format!("ACL SETUSER {ACL_USER} on >password ");
    let line = readme
        .lines()
        .find(|line| line.starts_with(&prefix))
        .ok_or("the README's ACL SETUSER line")?;
    let readme_rules: Vec<&str> = line[prefix.len()..].split_whitespace().collect();
    assert_eq!(readme_rules, ACL_RULES);
    Ok(())
}
