package monitoring_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

const alertTestsFile = "alerts_test.yml"

// promtool returns the path of promtool, or skips the test, saying how to get it.
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed: on Debian, apt-get install prometheus (CI installs it)")
	}
	return path
}

// ruleDescriptions maps each alert of the rules file to its description.
func ruleDescriptions(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(alertsFile)
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	out := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out[r.Alert] = r.Annotations["description"]
		}
	}
	return out
}

// Every alert rule passes promtool's unit tests in alerts_test.yml, and every alert has
// a test in which it fires.
func TestPromtoolRules(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	descriptions := ruleDescriptions(t)

	raw, err := os.ReadFile(alertTestsFile)
	require.NoError(t, err)
	var tests map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &tests))
	rulesPath, err := filepath.Abs(alertsFile)
	require.NoError(t, err)
	tests["rule_files"] = []string{rulesPath}
	fired := map[string]bool{}
	for _, tc := range tests["tests"].([]any) {
		for _, at := range tc.(map[string]any)["alert_rule_test"].([]any) {
			at := at.(map[string]any)
			name := at["alertname"].(string)
			require.Contains(t, descriptions, name, "%s tests an alert the rules do not have", alertTestsFile)
			exp, _ := at["exp_alerts"].([]any)
			for _, e := range exp {
				e := e.(map[string]any)
				ann, _ := e["exp_annotations"].(map[string]any)
				if ann == nil {
					ann = map[string]any{}
					e["exp_annotations"] = ann
				}
				if _, ok := ann["description"]; !ok {
					ann["description"] = descriptions[name]
				}
				fired[name] = true
			}
		}
	}
	for name := range descriptions {
		require.True(t, fired[name], "%s has no test in which %s fires", alertTestsFile, name)
	}

	out, err := yaml.Marshal(tests)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), alertTestsFile)
	require.NoError(t, os.WriteFile(path, out, 0o644))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "check", "rules", rulesPath)
	cmd.Stdout, cmd.Stderr = &stdout, &stdout
	require.NoError(t, cmd.Run(), "promtool check rules:\n%s", stdout.String())
	stdout.Reset()
	cmd = exec.CommandContext(ctx, bin, "test", "rules", path)
	cmd.Stdout, cmd.Stderr = &stdout, &stdout
	require.NoError(t, cmd.Run(), "promtool test rules:\n%s", stdout.String())
}
